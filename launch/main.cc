// The `strata` executable: everything is in launch/cli.cc so tests can link it.
#include "launch/cli.h"

int main(int argc, char** argv) {
  return strata::run_cli(argc, argv);
}

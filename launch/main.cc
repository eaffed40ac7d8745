// Placeholder entry point; replaced by the real command line in this same series of commits.
#include <cstdio>
int main() {
  std::puts("strata: under construction");
  return 0;
}

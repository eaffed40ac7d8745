#include "runtime/base/check.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "runtime/base/abort_hook.h"

namespace strata {
namespace {
int g_rank = 0;
int g_world = 1;
std::string& host_storage() {
  static std::string host = [] {
    char buf[256] = {0};
    if (gethostname(buf, sizeof(buf) - 1) != 0) return std::string("?");
    return std::string(buf);
  }();
  return host;
}
}  // namespace

void set_process_identity(int world_rank, int world_size) {
  g_rank = world_rank;
  g_world = world_size;
}
int process_rank() {
  return g_rank;
}
const std::string& process_host() {
  return host_storage();
}

void fatal(const std::string& what, const char* file, int line) {
  std::fprintf(stderr, "[rank %d host %s] fatal: %s at %s:%d\n", g_rank, process_host().c_str(),
               what.c_str(), file, line);
  std::fflush(stderr);
  abort_job(1);
}

}  // namespace strata

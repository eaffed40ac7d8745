#include "runtime/base/operation.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "runtime/base/error.h"

namespace strata {
namespace {

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

int64_t physical_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

int64_t address_space_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_AS, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<int64_t>(r.rlim_cur);
}

// cgroup v2's memory.max of this process's group ("max": none).
int64_t cgroup_limit() {
  std::ifstream cg("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(cg, line))
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  if (path.empty()) return 0;
  std::ifstream max("/sys/fs/cgroup" + path + "/memory.max");
  std::string v;
  if (!(max >> v) || v == "max") return 0;
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  return *end == '\0' && n > 0 ? n : 0;
}

}  // namespace

int64_t address_space_limit_bytes() {
  return address_space_limit();
}

int64_t cgroup_memory_limit_bytes() {
  return cgroup_limit();
}

std::string memory_limit_text() {
  const int64_t physical = physical_bytes(), as = address_space_limit(), cg = cgroup_limit();
  if (as > 0 && (physical == 0 || as < physical) && (cg == 0 || as <= cg))
    return "ulimit -v " + gib(static_cast<double>(as));
  if (cg > 0 && (physical == 0 || cg < physical)) return "cgroup memory.max " + gib(cg);
  return physical > 0 ? "this machine has " + gib(static_cast<double>(physical)) : "";
}

bool test_out_of_memory(const Operation& op) {
  static const char* hook = std::getenv("STRATA_TEST_OUT_OF_MEMORY");
  return hook != nullptr && *hook != '\0' && op.what.find(hook) != std::string::npos;
}

void out_of_memory(const Operation& op) {
  const std::string limit = memory_limit_text();
  const std::string tail = limit.empty() ? "" : " (" + limit + ")";
  if (!op.file.empty())
    throw InputError(
        op.file, op.where,
        "sizes that this process's memory holds: " + op.what + " ran out of host memory" + tail);
  throw OutOfMemory("out of host memory while " + op.what + tail);
}

}  // namespace strata

#include "runtime/abort_hook.h"

#include <cstdio>
#include <cstdlib>

namespace strata {
namespace {
AbortHook g_hook = nullptr;
}

void set_abort_hook(AbortHook hook) { g_hook = hook; }

void abort_job(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (g_hook) g_hook(status);
  std::_Exit(status);
}

}  // namespace strata

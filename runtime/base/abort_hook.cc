#include "runtime/base/abort_hook.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <system_error>
#include <thread>

#include "runtime/base/check.h"

namespace strata {
namespace {
AbortHook g_hook = nullptr;
double g_grace_s = 2.0;
}  // namespace

void set_abort_hook(AbortHook hook, double grace_s) {
  g_hook = hook;
  g_grace_s = grace_s;
}

void abort_job(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (g_hook) {
    if (g_grace_s > 0) {
      // Detached: it outlives this call only if the hook does not end the process in time.
      try {
        std::thread([status, grace = g_grace_s] {
          std::this_thread::sleep_for(std::chrono::duration<double>(grace));
          char line[160];
          std::snprintf(line, sizeof line,
                        "[rank %d] the job-wide abort did not end this process within %g s: "
                        "exiting\n",
                        process_rank(), grace);
          std::fputs(line, stderr);
          std::_Exit(status);
        }).detach();
      } catch (const std::system_error&) {
        // No thread to be had: the hook runs unbounded, as before.
      }
    }
    g_hook(status);
  }
  std::_Exit(status);
}

}  // namespace strata

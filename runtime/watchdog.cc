#include "runtime/watchdog.h"

#include <sched.h>

#include <atomic>
#include <cstdio>
#include <sstream>

#include "runtime/abort_hook.h"
#include "runtime/check.h"

namespace strata {
namespace {
thread_local std::string t_wait_context;
std::atomic<bool> g_poll_yield{true};
}  // namespace

void set_wait_context(std::string step) {
  t_wait_context = std::move(step);
}
const std::string& wait_context() {
  return t_wait_context;
}

std::string watchdog_message(int world_rank, double waited_s, const std::string& what,
                             const std::string& context) {
  std::ostringstream os;
  os << "[rank " << world_rank << "] watchdog: no progress for " << waited_s << " s in " << what;
  if (!context.empty()) os << " at schedule step \"" << context << "\"";
  return os.str();
}

void watchdog_expire(double waited_s, const std::string& what, const std::string& context) {
  // One write per line so that the lines of several ranks do not interleave mid-line.
  const std::string line = watchdog_message(process_rank(), waited_s, what, context) + "\n";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  abort_job(1);
}

void poll_pause() {
  if (g_poll_yield.load(std::memory_order_relaxed)) sched_yield();
}
void set_poll_yield(bool yield) {
  g_poll_yield.store(yield, std::memory_order_relaxed);
}
bool poll_yield() {
  return g_poll_yield.load(std::memory_order_relaxed);
}

std::string describe_p2p(bool is_send, int peer_world_rank, const std::string& group,
                         size_t bytes) {
  std::ostringstream os;
  os << (is_send ? "send to" : "recv from") << " world rank " << peer_world_rank << " (group "
     << group << ", " << bytes << " bytes)";
  return os.str();
}

std::string describe_collective(const char* op, const std::string& group, int group_size,
                                size_t bytes) {
  std::ostringstream os;
  os << op << " (group " << group << ", " << group_size << " ranks, " << bytes << " bytes)";
  return os.str();
}

}  // namespace strata

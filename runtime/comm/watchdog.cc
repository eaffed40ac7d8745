#include "runtime/comm/watchdog.h"

#include <sched.h>
#include <unistd.h>
#if defined(__linux__)
#include <signal.h>
#include <sys/prctl.h>
#endif

#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <thread>

#include "runtime/base/abort_hook.h"
#include "runtime/base/check.h"

namespace strata {
namespace {
thread_local std::string t_wait_context;
std::atomic<bool> g_poll_yield{true};
std::atomic<pid_t> g_launcher{0};  // the parent watch_launcher() recorded; 0: not watched

// This rank as the launcher's environment says (before MPI_Init), else process_rank().
int rank_for_messages() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return process_rank();
}
}  // namespace

struct WatchdogTimer::State {
  std::mutex mu;
  std::condition_variable cv;
  bool disarmed = false;
};

WatchdogTimer::WatchdogTimer(double timeout_s, std::string what) {
  if (timeout_s <= 0) return;
  state_ = std::make_shared<State>();
  // Detached and owning its state: disarming never waits for the thread, and a process that
  // exits while it waits frees nothing under it.
  std::thread([st = state_, timeout_s, what = std::move(what)] {
    std::unique_lock<std::mutex> lock(st->mu);
    if (st->cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                        [&] { return st->disarmed; }))
      return;
    const std::string line = watchdog_message(rank_for_messages(), timeout_s, what, "") + "\n";
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(1);
  }).detach();
}

WatchdogTimer::~WatchdogTimer() {
  if (!state_) return;
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->disarmed = true;
  state_->cv.notify_all();
}

void watch_launcher() {
  const pid_t parent = ::getppid();
#if defined(__linux__)
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
  g_launcher.store(parent);
  // The parent may have died between getppid() and prctl(): its signal would never come.
  exit_if_orphaned();
}

void exit_if_orphaned() {
  const pid_t launcher = g_launcher.load(std::memory_order_relaxed);
  if (launcher == 0 || ::getppid() == launcher) return;
  // Nothing reads this rank's output any more; the line is for a terminal that might.
  const std::string line = "[rank " + std::to_string(rank_for_messages()) + "] launcher (pid " +
                           std::to_string(launcher) + ") is gone: stopping\n";
  std::fputs(line.c_str(), stderr);
  std::_Exit(1);
}

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

bool should_poll_yield(int local_size, unsigned cores, const char* mpi_yield_when_idle) {
  if (mpi_yield_when_idle != nullptr) {
    // Open MPI's spellings of a boolean MCA value.
    std::string v(mpi_yield_when_idle);
    for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (v == "1" || v == "true" || v == "yes" || v == "enabled") return true;
    if (v == "0" || v == "false" || v == "no" || v == "disabled") return false;
  }
  return cores == 0 || static_cast<unsigned>(local_size) > cores;
}

std::string describe_p2p(bool is_send, int peer_world_rank, const std::string& group, size_t bytes,
                         const std::string& what) {
  std::ostringstream os;
  if (!what.empty()) os << what << ": ";
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

// watchdog.h — deadlines on every blocking communication wait, so a hang becomes a message.
//
// A wait that makes no progress for comm.timeout_s seconds prints exactly one line on its rank,
//   [rank 3] watchdog: no progress for 300 s in recv from world rank 2 (group pp, 4194304 bytes)
//   at schedule step "stage 1: recv-forward mb 3"
// (one line; wrapped here) and aborts the whole job with status 1 through abort_job() (MPI_Abort
// once init_world() has run), so the other ranks do not stay blocked behind it.
//
// Host waits (MPI, the NCCL barrier) poll their operation on the waiting thread with
// poll_until(): test, yield the core when ranks are oversubscribed, compare with the deadline.
// Stream-ordered NCCL work is watched by a background thread of the NCCL backend that polls the
// operations' CUDA events with the same deadline and message.
//
// Thread-safety: the wait context is per thread (the pipeline executor sets it on the thread that
// waits). watchdog_expire() may be called from any thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace strata {

// Names the schedule step the calling thread is about to wait in, e.g.
// "stage 1: recv-forward mb 3"; "" clears it. Appears in watchdog messages.
void set_wait_context(std::string step);
const std::string& wait_context();

// Sets the wait context for a scope and restores the previous one.
class WaitContextScope {
 public:
  explicit WaitContextScope(std::string step) : previous_(wait_context()) {
    set_wait_context(std::move(step));
  }
  ~WaitContextScope() { set_wait_context(std::move(previous_)); }
  WaitContextScope(const WaitContextScope&) = delete;
  WaitContextScope& operator=(const WaitContextScope&) = delete;

 private:
  std::string previous_;
};

// The one-line message (no newline). `what` describes the wait, e.g.
// "recv from world rank 2 (group pp, 4194304 bytes)"; `context` is a wait context ("" for none).
std::string watchdog_message(int world_rank, double waited_s, const std::string& what,
                             const std::string& context);

// Prints watchdog_message() for this rank and thread to stderr and aborts the job (status 1).
[[noreturn]] void watchdog_expire(double waited_s, const std::string& what,
                                  const std::string& context);

// Between polls: yields the core (sched_yield) when yielding is on, else returns at once.
void poll_pause();
// Yielding costs latency when every rank has its own core and is what lets a peer run when ranks
// outnumber cores. On by default; init_world() sets it by should_poll_yield().
void set_poll_yield(bool yield);
bool poll_yield();
// Whether waits yield: as Open MPI's mpi_yield_when_idle says when it was set (mpirun --mca
// mpi_yield_when_idle 1 reaches the ranks as OMPI_MCA_mpi_yield_when_idle, passed here; nullptr
// or an unrecognised value: not set), so that MPI's waits and Strata's agree; otherwise when
// this host runs more ranks (local_size) than it has cores (0: unknown, yield), the way Open MPI
// decides it by itself. The setting is for what the core count cannot see: "hosts" that share
// cores (containers, network namespaces on one machine) or cores shared with other jobs.
bool should_poll_yield(int local_size, unsigned cores, const char* mpi_yield_when_idle);

// Bounds a blocking call that cannot be polled — MPI_Init (a rank that never starts) and
// MPI_Finalize (a stopped launcher or rank) — with a deadline. While the timer lives, a thread
// waits; if timeout_s passes first, it prints the watchdog line for `what` (the rank from the
// launcher's environment before MPI knows it) and ends this process with status 1 through
// std::_Exit: inside those calls MPI cannot abort the job, and the launcher, seeing a rank fail,
// ends the others. timeout_s <= 0: no deadline.
class WatchdogTimer {
 public:
  WatchdogTimer(double timeout_s, std::string what);
  ~WatchdogTimer();  // disarms
  WatchdogTimer(const WatchdogTimer&) = delete;
  WatchdogTimer& operator=(const WatchdogTimer&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// The launcher watch: a rank whose launcher (the process that started it: mpirun, an Open MPI
// daemon (orted, prted), srun's step daemon) is gone must stop at once — no one collects its
// output any more, and it must not write another checkpoint. watch_launcher() records this
// process's parent and, on Linux, asks the kernel to SIGKILL it when the parent dies
// (PR_SET_PDEATHSIG); call it once, before MPI_Init, in processes a launcher started.
// exit_if_orphaned() checks that the parent is still the recorded one and otherwise ends this
// process at once (status 1); it runs before every checkpoint save and while a wait polls, for
// systems without the kernel's signal.
void watch_launcher();
void exit_if_orphaned();

// Calls test() until it returns true. Between polls the core is yielded. If timeout_s > 0 and
// more than timeout_s seconds pass, the watchdog fires with describe()'s text (built only then).
// timeout_s <= 0 waits forever. Every 1024 polls the launcher is checked (exit_if_orphaned).
template <class Test, class Describe>
void poll_until(Test&& test, double timeout_s, Describe&& describe) {
  if (test()) return;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto limit = std::chrono::duration<double>(timeout_s);
  for (unsigned polls = 1;; ++polls) {
    poll_pause();
    if (test()) return;
    if (polls % 1024 == 0) exit_if_orphaned();
    if (timeout_s > 0 && Clock::now() - start > limit) {
      watchdog_expire(timeout_s, describe(), wait_context());
    }
  }
}

// "4194304 bytes" style helpers shared by the backends' descriptions.
// what: the transfer's purpose, put first when given ("ring step 2 of 4: send to …").
std::string describe_p2p(bool is_send, int peer_world_rank, const std::string& group, size_t bytes,
                         const std::string& what = "");
std::string describe_collective(const char* op, const std::string& group, int group_size,
                                size_t bytes);

}  // namespace strata

#include "launch/train/stop_request.h"

#include <atomic>
#include <string>

namespace strata {
namespace {

// Written by the handler on whichever thread the signal is delivered to (the data prefetch
// thread, a checkpoint writer, MPI's progress thread) and read by the training thread: a
// lock-free atomic, which a signal handler may store to, rather than a volatile sig_atomic_t,
// which orders nothing between threads (ThreadSanitizer's finding in StopRequest's tests).
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free,
              "a signal handler may use only lock-free atomics");

void record(int sig) {
  g_signal.store(sig, std::memory_order_relaxed);
}

}  // namespace

std::atomic<bool> g_installed_early{false};

void install_stop_handlers() {
  if (g_installed_early.exchange(true)) return;
  struct sigaction sa = {};
  sa.sa_handler = record;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

StopRequest::StopRequest(Communicator& world) : world_(world) {
  // A signal recorded since install_stop_handlers (start-up, the resume) stays; otherwise a new
  // run starts from none.
  if (!g_installed_early.load()) g_signal.store(0, std::memory_order_relaxed);
  struct sigaction sa = {};
  sa.sa_handler = record;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &old_term_);
  sigaction(SIGUSR1, &sa, &old_usr1_);
}

StopRequest::~StopRequest() {
  exchange_.wait();  // every rank has one in flight: they complete together
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGUSR1, &old_usr1_, nullptr);
  g_signal.store(0, std::memory_order_relaxed);  // this run's; the next starts from none
}

int StopRequest::agree_before_first_step() {
  int32_t sig = g_signal.load(std::memory_order_relaxed);
  world_.all_reduce(&sig, 1, DType::kI32, ReduceOp::kMax);
  return sig;
}

StopRequest::Agreement StopRequest::poll(int64_t pending_save, bool writing) {
  Agreement a;
  // Not exchange_.pending(): on one rank the exchange completes when it is posted, and the
  // signal it carries would never be read.
  if (posted_) {
    exchange_.wait();
    a.signal = agreed_[0];
    // Every rank posted the same pending save (saves start at the same iteration everywhere).
    if (agreed_[1] == 0 && posted_save_ >= 0 && posted_save_ == pending_save)
      a.saved = posted_save_;
    if (a.signal != 0) return a;
  }
  agreed_[0] = g_signal.load(std::memory_order_relaxed);
  agreed_[1] = pending_save >= 0 && writing ? 1 : 0;
  posted_save_ = pending_save;
  exchange_ = world_.iall_reduce(agreed_, 2, DType::kI32, ReduceOp::kMax);
  posted_ = true;
  return a;
}

const char* signal_name(int sig) {
  if (sig == SIGTERM) return "SIGTERM";
  if (sig == SIGUSR1) return "SIGUSR1";
  static thread_local std::string other;
  other = "signal " + std::to_string(sig);
  return other.c_str();
}

}  // namespace strata

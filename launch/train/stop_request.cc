#include "launch/train/stop_request.h"

#include <string>

namespace strata {
namespace {

volatile std::sig_atomic_t g_signal = 0;

void record(int sig) { g_signal = sig; }

}  // namespace

StopRequest::StopRequest(Communicator& world) : world_(world) {
  g_signal = 0;
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
  agreed_[0] = g_signal;
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

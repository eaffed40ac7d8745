// stop_request.h — SIGTERM or SIGUSR1 during training: a checkpoint, then a clean exit.
//
// The batch systems' convention (Slurm's --signal=USR1@120, a preemption's SIGTERM): a signal
// some time before the job is killed asks it to save and stop. The handler only records the
// signal. The ranks agree on it without a barrier of their own: at the end of every iteration
// each rank posts a non-blocking max over the world of what it has seen, and reads the previous
// iteration's result, so every rank stops after the same iteration — one iteration after the
// first rank saw the signal. The trainer then saves a checkpoint (when checkpoint.dir is set) and
// `strata train` exits with status 4; a rerun resumes from it. PipeDream-2BW checks between its
// instruction lists, which end at its checkpoints (checkpoint.interval).
//
// Under Open MPI's mpirun, signal mpirun with SIGUSR1: it forwards SIGUSR1 and SIGUSR2 to every
// rank (a SIGTERM to mpirun ends the job instead). Under srun every task receives the signal.
//
// Thread-safety: one per run, driven from the training thread; the handler is async-signal-safe.
#pragma once

#include <csignal>
#include <cstdint>

#include "runtime/comm.h"

namespace strata {

class StopRequest {
 public:
  // Installs the handlers for SIGTERM and SIGUSR1 (the previous ones come back with the
  // destructor). world: every rank of the job (host buffers).
  explicit StopRequest(Communicator& world);
  ~StopRequest();
  StopRequest(const StopRequest&) = delete;
  StopRequest& operator=(const StopRequest&) = delete;

  // Called by every rank at the end of every iteration: the signal every rank has agreed to
  // stop for (the exchange of the previous call), else 0.
  int poll();

 private:
  Communicator& world_;
  int32_t agreed_ = 0;  // the exchange's buffer
  Request exchange_;
  bool posted_ = false;  // an exchange was posted (it may have completed at once: one rank)
  struct sigaction old_term_ = {}, old_usr1_ = {};
};

// "SIGTERM", "SIGUSR1", else "signal N".
const char* signal_name(int sig);

}  // namespace strata

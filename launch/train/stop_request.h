// stop_request.h — SIGTERM or SIGUSR1 during training: a checkpoint, then a clean exit.
//
// The batch systems' convention (Slurm's --signal=USR1@120, a preemption's SIGTERM): a signal
// some time before the job is killed asks it to save and stop. The handler only records the
// signal. The ranks agree on it without a barrier of their own: at the end of every iteration
// each rank posts a non-blocking max over the world of what it has seen, and reads the previous
// iteration's result, so every rank stops after the same iteration — one iteration after the
// first rank saw the signal. The same exchange carries whether each rank is still writing its
// shard of a background checkpoint save (checkpoint.async), so every rank publishes that save at
// the same iteration, once all have written, with no barrier of its own. The trainer then saves a
// checkpoint (when checkpoint.dir is set) and
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

#include "runtime/comm/comm.h"

namespace strata {

class StopRequest {
 public:
  // Installs the handlers for SIGTERM and SIGUSR1 (the previous ones come back with the
  // destructor). world: every rank of the job (host buffers).
  explicit StopRequest(Communicator& world);
  ~StopRequest();
  StopRequest(const StopRequest&) = delete;
  StopRequest& operator=(const StopRequest&) = delete;

  // What every rank agreed on in the exchange the previous call posted.
  struct Agreement {
    int signal = 0;      // the signal every rank agreed to stop for, else 0
    int64_t saved = -1;  // the background checkpoint save whose shard every rank had written
                         // (CheckpointSaver::pending's number), else -1
  };
  // Called by every rank at the end of every iteration, with its pending background save (-1:
  // none) and whether its shard is still being written: the exchange also tells the ranks, at
  // the same iteration, when a save can be published.
  Agreement poll(int64_t pending_save = -1, bool writing = false);
  // Before the first step: the signal any rank has seen since the handlers were installed
  // (start-up, a resume), agreed at once (blocking, collective), else 0.
  int agree_before_first_step();

 private:
  Communicator& world_;
  int32_t agreed_[2] = {0, 0};  // the exchange's buffer: max of (signal, still writing)
  int64_t posted_save_ = -1;    // the pending save when the exchange was posted
  Request exchange_;
  bool posted_ = false;  // an exchange was posted (it may have completed at once: one rank)
  struct sigaction old_term_ = {}, old_usr1_ = {};
};

// Installs the recording handlers for SIGTERM and SIGUSR1 for the rest of the process, as the
// first thing `strata train` does: a stop asked for during start-up or a resume is kept for
// StopRequest (before, the signal's default action killed the process). Idempotent.
void install_stop_handlers();

// "SIGTERM", "SIGUSR1", else "signal N".
const char* signal_name(int sig);

}  // namespace strata

// run_layout.h — everything about a training run's shape, computed once from the config: the
// world and this rank's place in it, the parallel sizes, the schedule, recompute and precision as
// typed values, the batch arithmetic and the layer split. The flow (trainer.cc) and its units take
// a RunLayout instead of re-reading the config.
//
// The layer split comes from partitioner/layer_split.h, the same function the dry run, the
// start-up memory check and the planner's prediction for a config use.
//
// Thread-safety: a value, built once per run.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "runtime/backend/backend.h"
#include "runtime/base/config.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/process_groups.h"
#include "schedules/schedule.h"

namespace strata {

struct RunContext;  // trainer.h

struct RunLayout {
  const Config* cfg = nullptr;
  const World* world = nullptr;  // the job's, or a world of one (RunContext::single_process)
  bool single_process = false;

  int tensor = 1, pipeline = 1, data = 1;
  int virtual_stages = 1;
  ScheduleKind schedule = ScheduleKind::kOneFOneB;  // as configured
  Recompute recompute = Recompute::kNone;
  bool bf16 = false;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  int threads = 1;  // CPU threads of this rank

  int micro = 0;   // sequences per micro-batch
  int global = 0;  // sequences per iteration
  int seq_len = 0;
  int accumulation = 0;    // micro-batches per pipeline per iteration
  RankCoord coord;         // this rank's (tp, dp, pp)
  std::vector<int> split;  // [piece] layers, piece = chunk·p + stage

  bool two_bw() const { return schedule == ScheduleKind::kTwoBW; }
  int pieces() const { return pipeline * virtual_stages; }
  double tokens_per_iteration() const { return static_cast<double>(global) * seq_len; }
  // The model pieces pipeline stage `stage` holds: chunk c is piece c·p + stage.
  std::vector<ModelPiece> stage_pieces(int stage) const;
  // How this rank builds its part of the model (the tensor group is the caller's).
  ModelOptions model_options(int stage, Communicator* tensor_group) const;
  // The pipeline schedule of a training batch (2bw: of the whole run, which never flushes).
  ScheduleSpec train_spec() const;
  // Where the run's tensors live: the device make_backend() picks for cfg.device.
  Device tensor_device() const;
  // How tensors on `d` travel between ranks (NCCL, MPI, or MPI staged through host memory). A
  // pipeline schedule that needs buffered sends (2bw, and interleaved with micro-batch groups
  // larger than p: runs_on_rendezvous_sends, simulator.h) does not run on NCCL, whose sends wait
  // for their receive, so it keeps them on staged MPI.
  Transport transport(Device d) const;
  // The groups carrying be's tensors, ordered after be's compute stream. Create be first: the
  // groups may hold its staging and stream until they are destroyed.
  ProcessGroups groups(Backend& be) const;
  // Host-only groups, for the dry run (no device is touched).
  ProcessGroups host_groups() const;
};

// Validates cfg against the world size (InputError) and computes the layout.
RunLayout make_run_layout(const Config& cfg, bool single_process);

}  // namespace strata

// run_layout.h — everything about a training run's shape, computed once from the config: the
// world and this rank's place in it, the parallel layout resolved for that world (sizes,
// schedule, recompute, micro-batches, the layer split: runtime/base/parallel_layout.h), the
// precision and the threads. The flow (trainer.cc) and its units read the layout from here,
// never from the config; the config's other sections (data, optimizer, checkpoint, log, comm)
// they still take from `cfg`.
//
// The layout is launch/config/world_layout.h's, the same the dry run, the start-up memory check
// and the planner's prediction of the config use.
//
// Thread-safety: a value, built once per run.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "runtime/backend/backend.h"
#include "runtime/base/config.h"
#include "runtime/base/parallel_layout.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/process_groups.h"
#include "schedules/schedule.h"

namespace strata {

struct RunLayout {
  const Config* cfg = nullptr;   // the sections that are not the layout
  const World* world = nullptr;  // the job's, or a world of one (RunContext::single_process)
  bool single_process = false;

  // The config's layout on this world: data, num_microbatches and layers_per_piece resolved.
  ParallelLayout layout;
  bool bf16 = false;
  int threads = 1;  // CPU threads of this rank
  int global = 0;   // sequences per iteration
  int seq_len = 0;
  RankCoord coord;  // this rank's (tp, dp, pp)

  // Whether the schedule drains the pipeline after every batch (schedules/schedule.h): all but
  // 2bw, whose instruction lists span batches and which keeps two weight versions.
  bool flushes() const { return flushes_every_batch(layout.schedule); }
  double tokens_per_iteration() const { return static_cast<double>(global) * seq_len; }
  // The model pieces pipeline stage `stage` holds: chunk c is piece c·p + stage.
  std::vector<ModelPiece> stage_pieces(int stage) const;
  // How this rank builds its part of the model (the tensor and expert groups are the caller's).
  ModelOptions model_options(int stage, const ProcessGroups& groups) const;
  // The run's pipeline schedule: one batch, or for a schedule that does not flush every batch of
  // the run (its instruction lists are stretches of it).
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

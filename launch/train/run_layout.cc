#include "launch/train/run_layout.h"

#include <algorithm>

#include "launch/config/config_parse.h"
#include "launch/config/world_layout.h"
#include "runtime/base/error.h"
#include "schedules/simulator.h"

namespace strata {
namespace {

const World& solo_world() {
  static const World solo = [] {
    World s;
    s.host = world().host;
    return s;
  }();
  return solo;
}

}  // namespace

RunLayout make_run_layout(const Config& cfg, bool single_process) {
  RunLayout r;
  r.cfg = &cfg;
  r.single_process = single_process;
  r.world = single_process ? &solo_world() : &world();
  const World& w = *r.world;
  validate_for_world(cfg, w.size);
  r.tensor = cfg.layout.tensor;
  r.pipeline = cfg.layout.pipeline;
  r.data = data_parallel_size(cfg, w.size);
  r.virtual_stages = cfg.layout.virtual_stages;
  // The schedule, recompute and split as the planner's prediction of this config sees them.
  const ParallelLayout plan = layout_for_world(cfg, w.size);
  r.schedule = plan.schedule;
  r.recompute = plan.recompute;
  r.bf16 = cfg.train.precision == "bf16";
  r.sequence_parallel = cfg.layout.sequence_parallel;
  r.distributed_optimizer = cfg.layout.distributed_optimizer;
  r.threads = resolve_cpu_threads(cfg.train.threads, w.local_size);
  r.micro = cfg.layout.micro_batch_size;
  r.global = cfg.train.global_batch_size;
  r.seq_len = cfg.model.seq_len;
  r.accumulation = microbatches_per_pipeline(cfg, w.size);
  // This rank's coordinates, from the group layout (the same formula as the groups).
  r.coord = group_layout(r.tensor, r.pipeline, r.data).coord(w.rank);
  r.split = plan.layers_per_piece;
  return r;
}

std::vector<ModelPiece> RunLayout::stage_pieces(int stage) const {
  std::vector<int> first(split.size() + 1, 0);
  for (size_t k = 0; k < split.size(); ++k) first[k + 1] = first[k] + split[k];
  std::vector<ModelPiece> pieces;
  for (int c = 0; c < virtual_stages; ++c) {
    const int k = c * pipeline + stage;
    pieces.push_back({first[static_cast<size_t>(k)], split[static_cast<size_t>(k)], k == 0,
                      k == this->pieces() - 1});
  }
  return pieces;
}

ModelOptions RunLayout::model_options(int stage, Communicator* tensor_group) const {
  ModelOptions o;
  o.tensor = tensor;
  o.tensor_rank = coord.tp;
  o.tensor_group = tensor_group;
  o.sequence_parallel = sequence_parallel;
  o.bf16 = bf16;
  o.recompute = recompute;
  o.pieces = stage_pieces(stage);
  o.seed = cfg->train.seed;
  return o;
}

ScheduleSpec RunLayout::train_spec() const {
  ScheduleSpec spec;
  spec.kind =
      pipeline == 1 && schedule == ScheduleKind::kInterleaved ? ScheduleKind::kOneFOneB : schedule;
  spec.stages = pipeline;
  spec.microbatches = accumulation;
  spec.chunks = spec.kind == ScheduleKind::kInterleaved ? virtual_stages : 1;
  spec.batches = two_bw() ? std::max(1, cfg->train.iterations) : 1;
  return spec;
}

Device RunLayout::tensor_device() const {
  return backend_device(cfg->device);
}

Transport RunLayout::transport(Device d) const {
  const ScheduleSpec spec = train_spec();
  const bool buffered =
      pipeline > 1 && schedule_invalid_reason(spec).empty() && !runs_on_rendezvous_sends(spec);
  return choose_transport(d, world->size, world->local_size, cuda_device_count(),
                          backend_available(CommBackend::kNCCL), buffered);
}

ProcessGroups RunLayout::groups(Backend& be) const {
  const std::shared_ptr<DeviceStaging> staging = be.comm_staging();
  if (single_process) return make_single_process_groups(cfg->comm.timeout_s, staging);
  const Transport t = transport(be.device());
  ProcessGroups g = make_process_groups(tensor, pipeline, data, t.backend, cfg->comm.timeout_s,
                                        t.staged ? staging : nullptr);
  g.set_compute_stream(be.compute_stream());
  return g;
}

ProcessGroups RunLayout::host_groups() const {
  if (single_process) return make_single_process_groups(cfg->comm.timeout_s);
  return make_process_groups(tensor, pipeline, data,
                             world->size > 1 ? CommBackend::kMPI : CommBackend::kLocal,
                             cfg->comm.timeout_s);
}

}  // namespace strata

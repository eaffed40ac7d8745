#include "launch/train/run_layout.h"

#include <algorithm>

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
  r.layout = layout_for_world(cfg, w.size);
  r.bf16 = cfg.train.precision == "bf16";
  r.threads = resolve_cpu_threads(cfg.train.threads, w.local_size);
  r.global = cfg.train.global_batch_size;
  r.seq_len = cfg.model.seq_len;
  // This rank's coordinates, from the group layout (the same formula as the groups).
  r.coord = group_layout(r.layout.tensor, r.layout.pipeline, r.layout.data, r.layout.expert,
                         r.layout.context)
                .coord(w.rank);
  return r;
}

std::vector<ModelPiece> RunLayout::stage_pieces(int stage) const {
  const std::vector<int>& split = layout.layers_per_piece;
  std::vector<int> first(split.size() + 1, 0);
  for (size_t k = 0; k < split.size(); ++k) first[k + 1] = first[k] + split[k];
  std::vector<ModelPiece> pieces;
  for (int c = 0; c < layout.virtual_stages; ++c) {
    const int k = c * layout.pipeline + stage;
    pieces.push_back({first[static_cast<size_t>(k)], split[static_cast<size_t>(k)], k == 0,
                      k == layout.pieces() - 1});
  }
  return pieces;
}

ModelOptions RunLayout::model_options(int stage, const ProcessGroups& groups) const {
  ModelOptions o;
  o.tensor = layout.tensor;
  o.tensor_rank = coord.tp;
  o.tensor_group = groups.tp.get();
  o.expert = groups.expert;
  o.expert_rank = groups.ep_rank;
  o.expert_group = groups.ep.get();
  o.context = groups.context;
  o.context_rank = groups.cp_rank;
  o.context_group = groups.cp.get();
  o.sequence_parallel = layout.sequence_parallel;
  o.bf16 = bf16;
  o.recompute = layout.recompute;
  o.pieces = stage_pieces(stage);
  o.seed = cfg->train.seed;
  return o;
}

ScheduleSpec RunLayout::train_spec() const {
  ScheduleSpec spec;
  // One stage runs every schedule as the same loop; interleaving needs a second stage.
  spec.kind = layout.pipeline == 1 && layout.schedule == ScheduleKind::kInterleaved
                  ? ScheduleKind::kOneFOneB
                  : layout.schedule;
  spec.stages = layout.pipeline;
  spec.microbatches = layout.num_microbatches;
  spec.chunks = spec.kind == ScheduleKind::kInterleaved ? layout.virtual_stages : 1;
  spec.batches = flushes() ? 1 : std::max(1, cfg->train.iterations);
  return spec;
}

Device RunLayout::tensor_device() const {
  return backend_device(cfg->device);
}

Transport RunLayout::transport(Device d) const {
  const ScheduleSpec spec = train_spec();
  const bool buffered = layout.pipeline > 1 && schedule_invalid_reason(spec).empty() &&
                        !runs_on_rendezvous_sends(spec);
  return choose_transport(d, world->size, world->local_size, cuda_device_count(),
                          backend_available(CommBackend::kNCCL), buffered);
}

ProcessGroups RunLayout::groups(Backend& be) const {
  const std::shared_ptr<DeviceStaging> staging = be.comm_staging();
  if (single_process) return make_single_process_groups(cfg->comm.timeout_s, staging);
  const Transport t = transport(be.device());
  ProcessGroups g = make_process_groups(layout.tensor, layout.pipeline, layout.data, t.backend,
                                        cfg->comm.timeout_s, t.staged ? staging : nullptr,
                                        layout.expert, layout.context);
  g.set_compute_stream(be.compute_stream());
  return g;
}

ProcessGroups RunLayout::host_groups() const {
  if (single_process) return make_single_process_groups(cfg->comm.timeout_s);
  return make_process_groups(layout.tensor, layout.pipeline, layout.data,
                             world->size > 1 ? CommBackend::kMPI : CommBackend::kLocal,
                             cfg->comm.timeout_s, nullptr, layout.expert, layout.context);
}

}  // namespace strata

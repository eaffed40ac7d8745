#include "launch/plan/prediction.h"

#include "models/registry.h"
#include "partitioner/layer_split.h"
#include "partitioner/planner.h"
#include "runtime/base/error.h"

namespace strata {

using nlohmann::json;

MemoryOptions memory_options(const std::string& precision, double bucket_mb, int threads,
                             bool cpu) {
  MemoryOptions o;
  o.precision = precision;
  if (cpu) {
    o.flash_attention = false;
    o.cpu_threads = threads;
  } else {
    o.flash_attention = true;
    o.reserve_bytes = 1024.0 * 1024.0 * 1024.0;  // CUDA context, NCCL, fragmentation
    o.workspace_bytes = 32.0 * 1024 * 1024;  // cuBLASLt's (runtime/backend/cuda/backend_cuda.cu)
  }
  o.bucket_mb = bucket_mb;
  return o;
}

PlanConfig plan_config_for(const Config& cfg, int world_size) {
  PlanConfig c;
  c.tensor = cfg.parallel.tensor;
  c.pipeline = cfg.parallel.pipeline;
  c.data = cfg.parallel.data.value_or(world_size / (c.tensor * c.pipeline));
  c.virtual_stages = cfg.parallel.virtual_stages;
  c.micro_batch_size = cfg.train.micro_batch_size;
  // The config parser accepted only known names (InputError here would be a parser bug's).
  if (!parse_schedule_kind(cfg.parallel.schedule, &c.schedule)) {
    throw InputError(cfg.source_file, "parallel.schedule", "a known schedule");
  }
  if (!parse_recompute(cfg.train.recompute, &c.recompute)) {
    throw InputError(cfg.source_file, "train.recompute", "none, selective or full");
  }
  c.sequence_parallel = cfg.parallel.sequence_parallel;
  c.distributed_optimizer = cfg.parallel.distributed_optimizer;
  // The split training runs (partitioner/layer_split.h), not one the planner would choose.
  c.layers_per_piece = layer_split(cfg.model.num_layers, c.pipeline * c.virtual_stages,
                                   cfg.parallel.layers_per_stage);
  return c;
}

json predict_for_config(const Config& cfg, int world_size, const Cluster& cluster_in) {
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.model_name = cfg.model.preset.empty() ? "custom" : cfg.model.preset;
  req.cluster = cluster_in;
  // The prediction is for this job's ranks, whatever size the cluster description has.
  if (world_size % req.cluster.gpus_per_node == 0) {
    req.cluster.nodes = world_size / req.cluster.gpus_per_node;
  } else {
    req.cluster.nodes = 1;
    req.cluster.gpus_per_node = world_size;
  }
  req.global_batch_size = cfg.train.global_batch_size;
  req.precision = cfg.train.precision;
  req.memory = memory_options(cfg.train.precision, cfg.parallel.bucket_mb,
                              cfg.train.threads.value_or(1), cfg.device != "cuda");
  // Strata's runtime on the config's device, whatever the cluster file says.
  req.runtime = strata_runtime(cfg.device != "cuda", cfg.train.precision, cfg.parallel.bucket_mb);
  const PlanConfig c = plan_config_for(cfg, world_size);
  const PlanResult r = evaluate_plan(req, c);
  json j = plan_result_json(r);
  const FlopCount f = req.model->flops_per_iteration(req.global_batch_size, c.recompute);
  j["model_flops"] = f.model;
  j["hardware_flops"] = f.hardware;
  return j;
}

}  // namespace strata

#include "launch/plan/prediction.h"

#include "launch/config/world_layout.h"
#include "models/registry.h"
#include "partitioner/planner.h"

namespace strata {

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

PlanRequest plan_request_for_config(const Config& cfg, int world_size, const Cluster& cluster) {
  PlanRequest req;
  req.model = describe_model(cfg.model);
  req.model_name = cfg.model.preset.empty() ? "custom" : cfg.model.preset;
  req.cluster = cluster;
  // The prediction is for this job's ranks, whatever size the cluster description has.
  if (world_size % req.cluster.gpus_per_node == 0) {
    req.cluster.nodes = world_size / req.cluster.gpus_per_node;
  } else {
    req.cluster.nodes = 1;
    req.cluster.gpus_per_node = world_size;
  }
  req.global_batch_size = cfg.train.global_batch_size;
  req.precision = cfg.train.precision;
  const bool cpu = cfg.device != "cuda";
  req.memory =
      memory_options(cfg.train.precision, cfg.comm.bucket_mb, cfg.train.threads.value_or(1), cpu);
  // Strata's runtime on the config's device, whatever the cluster file says.
  req.runtime = strata_runtime(cpu, cfg.train.precision, cfg.comm.bucket_mb);
  return req;
}

namespace {

// The prediction on `world_size` ranks (evaluate_plan refuses a layout of another size).
nlohmann::json predict(const Config& cfg, const ParallelLayout& layout, int world_size,
                       const Cluster& cluster) {
  const PlanRequest req = plan_request_for_config(cfg, world_size, cluster);
  const PlanResult r = evaluate_plan(req, layout);
  nlohmann::json j = plan_result_json(r);
  const FlopCount f = req.model->flops_per_iteration(req.global_batch_size, layout.recompute);
  j["model_flops"] = f.model;
  j["hardware_flops"] = f.hardware;
  return j;
}

}  // namespace

nlohmann::json predict_for_config(const Config& cfg, const ParallelLayout& layout,
                                  const Cluster& cluster) {
  return predict(cfg, layout, layout.tensor * layout.context * layout.pipeline * layout.data,
                 cluster);
}

nlohmann::json predict_for_config(const Config& cfg, int world_size, const Cluster& cluster) {
  return predict(cfg, layout_for_world(cfg, world_size), world_size, cluster);
}

}  // namespace strata

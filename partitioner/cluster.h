// cluster.h — the machine a plan is made for: nodes of identical GPUs joined by a fast
// intra-node fabric (NVLink/NVSwitch) and a slower inter-node network (InfiniBand, Ethernet).
//
// A cluster is read from JSON (configs/clusters/<name>.json or any file):
//   {"name": "dgx-h100", "nodes": 1, "gpus_per_node": 8,
//    "peak_flops": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},   dense FLOP/s per GPU
//    "memory_bytes": 85899345920,                                      per GPU
//    "hbm_bandwidth": 3.35e12,                                         bytes/s per GPU
//    "intra_node": {"bandwidth": 450e9, "latency_s": 3e-6, "efficiency": 0.8},
//                                          bytes/s per direction per GPU; share collectives reach
//    "inter_node": {"bandwidth": 50e9, "latency_s": 5e-6, "efficiency": 0.95},   per NIC
//    "nics_per_node": 8,
//    "device": "gpu",                      "gpu", or "cpu": the ranks are CPU processes (the
//                                          planner then prices Strata's CPU runtime)
//    "efficiency": {...}}                  the device's measured curves (efficiency.h)
// Unknown keys and wrong types throw InputError(file, json.path, expected). Precisions missing
// from peak_flops fall back bf16 → fp16 (V100 has no bf16: planning "bf16" there means fp16).
// A link's "efficiency" defaults to 0.8 within a node (NCCL rings over NVLink) and 0.95 between
// nodes (a NIC's line rate); a cluster without "efficiency" gets generic_efficiency() from its
// peaks and memory bandwidth, and says so (efficiency_measured false).
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "partitioner/efficiency.h"

namespace strata {

struct Link {
  double bandwidth = 0;  // bytes/s per direction
  double latency_s = 0;
  double efficiency = 1;  // share of `bandwidth` collectives reach
};

struct Cluster {
  std::string name;
  int nodes = 1;
  int gpus_per_node = 8;
  std::map<std::string, double> peak_flops;  // precision → dense FLOP/s per GPU
  double memory_bytes = 0;                   // per GPU
  double hbm_bandwidth = 0;                  // bytes/s per GPU
  Link intra_node;                           // per GPU
  Link inter_node;                           // per NIC
  int nics_per_node = 1;
  bool cpu = false;             // "device": "cpu"
  DeviceEfficiency efficiency;  // measured, or generic_efficiency()
  bool efficiency_measured = false;

  int world_size() const { return nodes * gpus_per_node; }
  // Peak FLOP/s for `precision`; InputError naming the cluster when it has none.
  double peak(const std::string& precision) const;
  // Inter-node bandwidth one GPU can use when every GPU of the node sends at once.
  double inter_node_bandwidth_per_gpu() const;
};

// Parses `j`; `file` names it in errors.
Cluster cluster_from_json(const nlohmann::json& j, const std::string& file);
nlohmann::json cluster_to_json(const Cluster& c);

// `name_or_path`: an existing file, else a preset in <configs_dir>/clusters/<name>.json.
// InputError when neither exists (listing the presets) or the JSON is bad.
Cluster load_cluster(const std::string& name_or_path, const std::string& configs_dir);

}  // namespace strata

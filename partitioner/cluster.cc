#include "partitioner/cluster.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "partitioner/json_read.h"
#include "runtime/base/error.h"
#include "runtime/io/json_file.h"

namespace strata {
namespace {

using json_read::number;
using json_read::only_keys;
using nlohmann::json;

int integer(const json& j, const std::string& key, const std::string& file) {
  if (!j.contains(key)) throw InputError(file, key, "a positive integer (missing)");
  const json& v = j.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 24)) {
    throw InputError(file, key, "a positive integer, got " + v.dump());
  }
  return v.get<int>();
}

Link link(const json& j, const std::string& key, const std::string& file,
          double default_efficiency) {
  if (!j.contains(key) || !j.at(key).is_object()) {
    throw InputError(file, key, "an object {\"bandwidth\": bytes/s, \"latency_s\": s}");
  }
  const json& o = j.at(key);
  only_keys(o, {"bandwidth", "latency_s", "efficiency"}, key, file);
  Link l;
  l.bandwidth = number(o, "bandwidth", key, file);
  l.latency_s = number(o, "latency_s", key, file, false);
  l.efficiency = default_efficiency;
  if (o.contains("efficiency")) {
    l.efficiency = number(o, "efficiency", key, file);
    if (l.efficiency > 1) throw InputError(file, key + ".efficiency", "a share in (0, 1]");
  }
  return l;
}

json link_json(const Link& l) {
  return {{"bandwidth", l.bandwidth}, {"latency_s", l.latency_s}, {"efficiency", l.efficiency}};
}

}  // namespace

double Cluster::peak(const std::string& precision) const {
  auto it = peak_flops.find(precision);
  if (it == peak_flops.end() && precision == "bf16") it = peak_flops.find("fp16");
  if (it == peak_flops.end()) {
    throw InputError(name, "peak_flops." + precision,
                     "a peak FLOP/s for precision " + precision + " in the cluster");
  }
  return it->second;
}

double Cluster::inter_node_bandwidth_per_gpu() const {
  return inter_node.bandwidth * nics_per_node / gpus_per_node;
}

Cluster cluster_from_json(const json& j, const std::string& file) {
  if (!j.is_object()) throw InputError(file, "", "a JSON object describing a cluster");
  only_keys(j,
            {"name", "nodes", "gpus_per_node", "peak_flops", "memory_bytes", "hbm_bandwidth",
             "intra_node", "inter_node", "nics_per_node", "device", "efficiency"},
            "", file);
  Cluster c;
  if (j.contains("name")) {
    if (!j.at("name").is_string()) throw InputError(file, "name", "a string");
    c.name = j.at("name").get<std::string>();
  } else {
    c.name = std::filesystem::path(file).stem().string();
  }
  c.nodes = integer(j, "nodes", file);
  c.gpus_per_node = integer(j, "gpus_per_node", file);
  if (!j.contains("peak_flops") || !j.at("peak_flops").is_object() || j.at("peak_flops").empty()) {
    throw InputError(file, "peak_flops",
                     "an object of precision → FLOP/s, e.g. {\"bf16\": 989e12}");
  }
  for (auto it = j.at("peak_flops").begin(); it != j.at("peak_flops").end(); ++it) {
    static const std::vector<std::string> kPrecisions = {"bf16", "fp16", "tf32", "fp32", "fp8"};
    if (std::find(kPrecisions.begin(), kPrecisions.end(), it.key()) == kPrecisions.end()) {
      throw InputError(file, "peak_flops." + it.key(), "a precision: bf16, fp16, tf32, fp32, fp8");
    }
    c.peak_flops[it.key()] = number(j.at("peak_flops"), it.key(), "peak_flops", file);
  }
  c.memory_bytes = number(j, "memory_bytes", "", file);
  c.hbm_bandwidth = number(j, "hbm_bandwidth", "", file);
  c.intra_node = link(j, "intra_node", file, 0.80);
  c.inter_node = link(j, "inter_node", file, 0.95);
  c.nics_per_node = integer(j, "nics_per_node", file);
  if (j.contains("device")) {
    const json& d = j.at("device");
    if (!d.is_string() || (d != "gpu" && d != "cpu"))
      throw InputError(file, "device", "\"gpu\" or \"cpu\", got " + d.dump());
    c.cpu = d == "cpu";
  }
  c.efficiency_measured = j.contains("efficiency");
  c.efficiency = c.efficiency_measured ? efficiency_from_json(j.at("efficiency"), file)
                                       : generic_efficiency(c.peak_flops, c.hbm_bandwidth);
  add_generic_curves(&c.efficiency, c.peak_flops, c.hbm_bandwidth);
  return c;
}

json cluster_to_json(const Cluster& c) {
  json pf = json::object();
  for (const auto& [k, v] : c.peak_flops) pf[k] = v;
  json j = {{"name", c.name},
            {"nodes", c.nodes},
            {"gpus_per_node", c.gpus_per_node},
            {"peak_flops", pf},
            {"memory_bytes", c.memory_bytes},
            {"hbm_bandwidth", c.hbm_bandwidth},
            {"intra_node", link_json(c.intra_node)},
            {"inter_node", link_json(c.inter_node)},
            {"nics_per_node", c.nics_per_node},
            {"device", c.cpu ? "cpu" : "gpu"}};
  if (c.efficiency_measured) j["efficiency"] = efficiency_to_json(c.efficiency);
  return j;
}

Cluster load_cluster(const std::string& name_or_path, const std::string& configs_dir) {
  namespace fs = std::filesystem;
  std::string path = name_or_path;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    const bool plain = !name_or_path.empty() && name_or_path.find('/') == std::string::npos &&
                       name_or_path[0] != '.';
    path = configs_dir + "/clusters/" + name_or_path + ".json";
    if (!plain || !fs::is_regular_file(path, ec)) {
      std::string names;
      for (const auto& e : fs::directory_iterator(configs_dir + "/clusters", ec)) {
        if (e.path().extension() == ".json") {
          names += (names.empty() ? "" : ", ") + e.path().stem().string();
        }
      }
      throw InputError("<command line>", "--cluster",
                       "a cluster file or preset (" + names + "), got '" + name_or_path + "'");
    }
  }
  return cluster_from_json(read_json_file(path), path);
}

}  // namespace strata

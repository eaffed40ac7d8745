#include "partitioner/efficiency.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "partitioner/json_read.h"
#include "runtime/base/error.h"

namespace strata {

using json_read::join_path;
using json_read::number;
using json_read::only_keys;
using nlohmann::json;

namespace {

// The correction toward measured points (efficiency.h): the spread of a point's influence in
// octaves, and the weight of "no correction".
constexpr double kSigmaOctaves = 0.75;
constexpr double kPriorWeight = 0.05;

double gemm_bytes(double M, double N, double K, double e) {
  return e * (M * K + K * N + M * N);
}

}  // namespace

double GemmCurve::curve_seconds(double M, double N, double K, double e, double batch,
                                double compute_share) const {
  const double compute = batch * 2 * M * N * K / (flops * compute_share);
  const double memory = bandwidth > 0 ? batch * gemm_bytes(M, N, K, e) / bandwidth : 0;
  return fixed_s + std::max(compute, memory);
}

double GemmCurve::seconds(double M, double N, double K, double e, double batch,
                          double compute_share) const {
  const double t = curve_seconds(M, N, K, e, batch, compute_share);
  if (points.empty()) return t;
  double sw = 0, swl = 0;
  for (const auto& p : points) {
    const double d2 = std::pow(std::log2(M / p[0]), 2) + std::pow(std::log2(N / p[1]), 2) +
                      std::pow(std::log2(K / p[2]), 2);
    const double w = std::exp(-d2 / (2 * kSigmaOctaves * kSigmaOctaves));
    if (w < 1e-6) continue;
    const double measured = 2 * p[0] * p[1] * p[2] / p[3];
    swl += w * std::log(measured / curve_seconds(p[0], p[1], p[2], e));
    sw += w;
  }
  return t * std::exp(swl / (sw + kPriorWeight));
}

GemmCurve fit_gemm_curve(const std::vector<std::array<double, 4>>& points, double e) {
  // Nelder-Mead on x = log(flops, fixed_s, bandwidth), minimising Σ (log t_curve − log t)².
  auto curve = [](const std::array<double, 3>& x) {
    GemmCurve c;
    c.flops = std::exp(x[0]);
    c.fixed_s = std::exp(x[1]);
    c.bandwidth = std::exp(x[2]);
    return c;
  };
  auto cost = [&](const std::array<double, 3>& x) {
    const GemmCurve c = curve(x);
    double s = 0;
    for (const auto& p : points) {
      const double t = 2 * p[0] * p[1] * p[2] / p[3];
      s += std::pow(std::log(c.curve_seconds(p[0], p[1], p[2], e) / t), 2);
    }
    return s;
  };
  double fmax = 0, tmin = std::numeric_limits<double>::infinity(), bwmax = 0;
  for (const auto& p : points) {
    const double t = 2 * p[0] * p[1] * p[2] / p[3];
    fmax = std::max(fmax, p[3]);
    tmin = std::min(tmin, t);
    bwmax = std::max(bwmax, gemm_bytes(p[0], p[1], p[2], e) / t);
  }
  std::array<std::array<double, 3>, 4> s;
  s[0] = {std::log(fmax * 1.05), std::log(tmin * 0.5), std::log(bwmax * 1.2)};
  for (int i = 1; i < 4; ++i) {
    s[static_cast<size_t>(i)] = s[0];
    s[static_cast<size_t>(i)][static_cast<size_t>(i - 1)] += 0.5;
  }
  std::array<double, 4> f;
  for (size_t i = 0; i < 4; ++i) f[i] = cost(s[i]);
  for (int iter = 0; iter < 2000; ++iter) {
    std::array<size_t, 4> o = {0, 1, 2, 3};
    std::sort(o.begin(), o.end(), [&](size_t a, size_t b) { return f[a] < f[b]; });
    const size_t best = o[0], worst = o[3], second = o[2];
    if (f[worst] - f[best] < 1e-12) break;
    std::array<double, 3> c = {0, 0, 0};
    for (size_t k = 0; k < 3; ++k)
      for (size_t i = 0; i < 3; ++i) c[k] += s[o[i]][k] / 3;
    auto along = [&](double a) {
      std::array<double, 3> x;
      for (size_t k = 0; k < 3; ++k) x[k] = c[k] + a * (s[worst][k] - c[k]);
      return x;
    };
    const std::array<double, 3> r = along(-1);
    const double fr = cost(r);
    if (fr < f[best]) {
      const std::array<double, 3> ex = along(-2);
      const double fe = cost(ex);
      s[worst] = fe < fr ? ex : r;
      f[worst] = std::min(fe, fr);
    } else if (fr < f[second]) {
      s[worst] = r;
      f[worst] = fr;
    } else {
      const std::array<double, 3> ct = along(fr < f[worst] ? -0.5 : 0.5);
      const double fc = cost(ct);
      if (fc < std::min(fr, f[worst])) {
        s[worst] = ct;
        f[worst] = fc;
      } else {
        for (size_t i = 1; i < 4; ++i) {
          for (size_t k = 0; k < 3; ++k) s[o[i]][k] = s[best][k] + 0.5 * (s[o[i]][k] - s[best][k]);
          f[o[i]] = cost(s[o[i]]);
        }
      }
    }
  }
  size_t best = 0;
  for (size_t i = 1; i < 4; ++i)
    if (f[i] < f[best]) best = i;
  GemmCurve out = curve(s[best]);
  out.points = points;
  return out;
}

double AttentionTable::flops(double seq, double head, bool backward_pass) const {
  const auto& table = backward_pass ? backward : forward;
  // log FLOP/s along seq among the entries of head size h: between the nearest entries below
  // and above seq (in log), held at the ends. No allocation: the planner asks often.
  const double x = std::log(seq);
  auto along_seq = [&](double h) {
    const std::array<double, 3>* lo = nullptr;
    const std::array<double, 3>* hi = nullptr;
    for (const auto& e : table) {
      if (e[1] != h) continue;
      if (e[0] <= seq && (lo == nullptr || e[0] > (*lo)[0])) lo = &e;
      if (e[0] >= seq && (hi == nullptr || e[0] < (*hi)[0])) hi = &e;
    }
    if (lo == nullptr) return std::log((*hi)[2]);
    if (hi == nullptr || lo == hi) return std::log((*lo)[2]);
    const double a = (x - std::log((*lo)[0])) / (std::log((*hi)[0]) - std::log((*lo)[0]));
    return std::log((*lo)[2]) + a * (std::log((*hi)[2]) - std::log((*lo)[2]));
  };
  double below = 0, above = std::numeric_limits<double>::infinity();
  double least = std::numeric_limits<double>::infinity(), most = 0;
  for (const auto& e : table) {
    if (e[1] <= head) below = std::max(below, e[1]);
    if (e[1] >= head) above = std::min(above, e[1]);
    least = std::min(least, e[1]);
    most = std::max(most, e[1]);
  }
  if (below == 0) return std::exp(along_seq(least));
  if (!std::isfinite(above)) return std::exp(along_seq(most));
  if (below == above) return std::exp(along_seq(below));
  const double a = (std::log(head) - std::log(below)) / (std::log(above) - std::log(below));
  return std::exp(along_seq(below) + a * (along_seq(above) - along_seq(below)));
}

const GemmCurve* DeviceEfficiency::gemm_for(const std::string& precision) const {
  auto it = gemm.find(precision);
  if (it == gemm.end() && precision == "bf16") it = gemm.find("fp16");
  if (it == gemm.end() && precision == "fp16") it = gemm.find("bf16");
  return it == gemm.end() ? nullptr : &it->second;
}

const AttentionTable* DeviceEfficiency::attention_for(const std::string& precision) const {
  auto it = attention.find(precision);
  if (it == attention.end() && precision == "bf16") it = attention.find("fp16");
  if (it == attention.end() && precision == "fp16") it = attention.find("bf16");
  return it == attention.end() ? nullptr : &it->second;
}

namespace {

const std::vector<std::string> kPrecisions = {"bf16", "fp16", "tf32", "fp32", "fp8"};

void check_precision(const std::string& key, const std::string& path, const std::string& file) {
  if (std::find(kPrecisions.begin(), kPrecisions.end(), key) == kPrecisions.end())
    throw InputError(file, join_path(path, key), "a precision: bf16, fp16, tf32, fp32, fp8");
}

// An array of rows of `width` positive numbers.
std::vector<std::vector<double>> rows(const json& j, const std::string& path,
                                      const std::string& file, size_t width,
                                      const std::string& what) {
  if (!j.is_array()) throw InputError(file, path, "an array of " + what);
  std::vector<std::vector<double>> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& r = j[i];
    const std::string w = path + "[" + std::to_string(i) + "]";
    if (!r.is_array() || r.size() != width) throw InputError(file, w, what);
    std::vector<double> row;
    for (const json& x : r) {
      if (!x.is_number() || !(x.get<double>() > 0)) throw InputError(file, w, what + " (positive)");
      row.push_back(x.get<double>());
    }
    out.push_back(row);
  }
  return out;
}

}  // namespace

DeviceEfficiency efficiency_from_json(const json& j, const std::string& file) {
  const std::string path = "efficiency";
  if (!j.is_object()) throw InputError(file, path, "an object of measured device figures");
  only_keys(j,
            {"source", "sustained", "gemm", "attention", "memory_bandwidth", "optimizer_bandwidth",
             "kernel_gap_s"},
            path, file);
  DeviceEfficiency e;
  if (j.contains("source")) {
    if (!j.at("source").is_string()) throw InputError(file, path + ".source", "a string");
    e.source = j.at("source").get<std::string>();
  }
  if (j.contains("sustained")) {
    e.sustained = number(j, "sustained", path, file);
    if (e.sustained > 1) throw InputError(file, path + ".sustained", "a share in (0, 1]");
  }
  const json& gemm =
      json_read::object(j, "gemm", path, file, "an object of precision → GEMM curve");
  for (auto it = gemm.begin(); it != gemm.end(); ++it) {
    const std::string p = path + ".gemm";
    check_precision(it.key(), p, file);
    const std::string cp = p + "." + it.key();
    const json& c = json_read::object(gemm, it.key(), p, file,
                                      "{\"flops\", \"fixed_s\", \"bandwidth\", \"points\"}");
    only_keys(c, {"flops", "fixed_s", "bandwidth", "points"}, cp, file);
    GemmCurve g;
    g.flops = number(c, "flops", cp, file);
    g.fixed_s = number(c, "fixed_s", cp, file, false);
    g.bandwidth = number(c, "bandwidth", cp, file);
    if (c.contains("points"))
      for (const auto& r : rows(c.at("points"), cp + ".points", file, 4, "[M, N, K, FLOP/s]"))
        g.points.push_back({r[0], r[1], r[2], r[3]});
    e.gemm[it.key()] = g;
  }
  if (e.gemm.empty()) throw InputError(file, path + ".gemm", "at least one precision's curve");
  if (j.contains("attention")) {
    const json& att =
        json_read::object(j, "attention", path, file, "an object of precision → attention table");
    for (auto it = att.begin(); it != att.end(); ++it) {
      const std::string p = path + ".attention";
      check_precision(it.key(), p, file);
      const std::string ap = p + "." + it.key();
      const json& a =
          json_read::object(att, it.key(), p, file, "{\"forward\": [...], \"backward\": [...]}");
      only_keys(a, {"forward", "backward"}, ap, file);
      AttentionTable t;
      for (const char* dir : {"forward", "backward"}) {
        if (!a.contains(dir)) throw InputError(file, ap + "." + dir, "an array (missing)");
        auto& dst = std::string(dir) == "forward" ? t.forward : t.backward;
        for (const auto& r :
             rows(a.at(dir), ap + "." + dir, file, 3, "[sequence, head size, FLOP/s]"))
          dst.push_back({r[0], r[1], r[2]});
        if (dst.empty()) throw InputError(file, ap + "." + dir, "at least one entry");
      }
      e.attention[it.key()] = t;
    }
  }
  e.memory_bandwidth = number(j, "memory_bandwidth", path, file);
  if (j.contains("optimizer_bandwidth"))
    e.optimizer_bandwidth = number(j, "optimizer_bandwidth", path, file);
  if (j.contains("kernel_gap_s")) e.kernel_gap_s = number(j, "kernel_gap_s", path, file, false);
  return e;
}

json efficiency_to_json(const DeviceEfficiency& e) {
  json gemm = json::object();
  for (const auto& [k, g] : e.gemm) {
    if (g.generic) continue;
    json pts = json::array();
    for (const auto& p : g.points) pts.push_back({p[0], p[1], p[2], p[3]});
    gemm[k] = {
        {"flops", g.flops}, {"fixed_s", g.fixed_s}, {"bandwidth", g.bandwidth}, {"points", pts}};
  }
  json att = json::object();
  for (const auto& [k, t] : e.attention) {
    if (t.generic) continue;
    json f = json::array(), b = json::array();
    for (const auto& r : t.forward) f.push_back({r[0], r[1], r[2]});
    for (const auto& r : t.backward) b.push_back({r[0], r[1], r[2]});
    att[k] = {{"forward", f}, {"backward", b}};
  }
  json j = {{"source", e.source},
            {"sustained", e.sustained},
            {"gemm", gemm},
            {"memory_bandwidth", e.memory_bandwidth},
            {"kernel_gap_s", e.kernel_gap_s}};
  if (!att.empty()) j["attention"] = att;
  if (e.optimizer_bandwidth > 0) j["optimizer_bandwidth"] = e.optimizer_bandwidth;
  return j;
}

DeviceEfficiency generic_efficiency(const std::map<std::string, double>& peak_flops,
                                    double memory_bandwidth) {
  DeviceEfficiency e;
  e.source = "generic: spec-sheet peaks only (no measured curves for this device)";
  for (const auto& [precision, peak] : peak_flops) {
    GemmCurve g;
    g.flops = 0.70 * peak;
    g.fixed_s = 5e-6;
    g.bandwidth = 0.80 * memory_bandwidth;
    g.generic = true;
    e.gemm[precision] = g;
    AttentionTable t;
    t.generic = true;
    for (double h : {64.0, 128.0}) {
      t.forward.push_back({2048, h, 0.35 * peak});
      t.backward.push_back({2048, h, 0.25 * peak});
    }
    e.attention[precision] = t;
  }
  e.memory_bandwidth = 0.80 * memory_bandwidth;
  e.kernel_gap_s = 3e-6;
  return e;
}

void add_generic_curves(DeviceEfficiency* e, const std::map<std::string, double>& peak_flops,
                        double memory_bandwidth) {
  const DeviceEfficiency g = generic_efficiency(peak_flops, memory_bandwidth);
  for (const auto& [precision, curve] : g.gemm)
    if (e->gemm_for(precision) == nullptr) e->gemm[precision] = curve;
  for (const auto& [precision, table] : g.attention)
    if (e->attention_for(precision) == nullptr) e->attention[precision] = table;
}

}  // namespace strata

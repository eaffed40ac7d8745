#include "launch/model_state.h"

#include <algorithm>

#include "runtime/error.h"

namespace strata {
namespace {

const char* split_name(ParamSplit s) {
  switch (s) {
    case ParamSplit::kReplicated:
      return "replicated";
    case ParamSplit::kRows:
      return "rows";
    case ParamSplit::kCols:
      return "cols";
    case ParamSplit::kQkvRows:
      return "qkv_rows";
  }
  return "replicated";
}

ParamSplit split_from(const std::string& s, const std::string& path, const std::string& name) {
  if (s == "replicated") return ParamSplit::kReplicated;
  if (s == "rows") return ParamSplit::kRows;
  if (s == "cols") return ParamSplit::kCols;
  if (s == "qkv_rows") return ParamSplit::kQkvRows;
  throw InputError(path, "meta:" + name, "split replicated, rows, cols or qkv_rows, got " + s);
}

// The parameter whose flat range holds `offset` (segments never cross parameters).
const ParamInfo& param_at(const std::vector<ParamInfo>& infos, int64_t offset) {
  for (const ParamInfo& p : infos)
    if (offset >= p.offset && offset < p.offset + p.numel) return p;
  throw std::logic_error("optimizer segment outside the parameters");
}

bool is_writer(const ParamInfo& p, int tp_rank) {
  // The last stage's tied wte is the first stage's parameter again; replicated parameters are
  // equal on every tensor rank.
  return !p.tied_copy && (p.split != ParamSplit::kReplicated || tp_rank == 0);
}

ShardMeta meta_of(const ParamInfo& p, const GptDims& d) {
  ShardMeta m;
  m.full_shape = p.full_shape;
  m.shard_shape = p.shape;
  m.split = split_name(p.split);
  m.tp_rank = p.split == ParamSplit::kReplicated ? 0 : d.tp_rank;
  m.tp = p.split == ParamSplit::kReplicated ? 1 : d.tp;
  return m;
}

// Checks that `f` can serve `p`: the same shape, or (vocabulary padding) the same trailing
// dimensions with another row count.
void check_compatible(const ParamInfo& p, const FullTensor& f, const std::string& path) {
  const bool same_tail = f.shape.size() == p.full_shape.size() && !f.shape.empty() &&
                         std::equal(f.shape.begin() + 1, f.shape.end(), p.full_shape.begin() + 1);
  const bool vocab = p.rows_initialised >= 0;
  if (f.shape == p.full_shape || (vocab && same_tail)) return;
  throw InputError(path, p.name,
                   "shape " + shape_string(p.full_shape) + ", found " + shape_string(f.shape));
}

FullTensor transpose(const FullTensor& t) {
  FullTensor o;
  const int64_t r = t.shape[0], c = t.shape[1];
  o.shape = {c, r};
  o.data.resize(t.data.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      o.data[static_cast<size_t>(j * r + i)] = t.data[static_cast<size_t>(i * c + j)];
  return o;
}

FullTensor first_rows(const FullTensor& t, int64_t rows) {
  FullTensor o;
  o.shape = t.shape;
  o.shape[0] = rows;
  const int64_t row = t.shape[1];
  o.data.assign(t.data.begin(), t.data.begin() + rows * row);
  return o;
}

}  // namespace

RankShard make_rank_shard(const GptModel& model, const std::vector<float>& params,
                          const std::vector<float>& m, const std::vector<float>& v,
                          const std::vector<OptSegment>& segments, int dp_rank, bool sharded) {
  const GptDims& d = model.dims();
  RankShard s;
  for (const ParamInfo& p : model.param_infos()) {
    if (!is_writer(p, d.tp_rank) || dp_rank != 0) continue;
    s.meta[p.name] = meta_of(p, d);
    s.pieces.push_back(
        {"param", p.name, 0,
         std::vector<float>(params.begin() + p.offset, params.begin() + p.offset + p.numel)});
  }
  for (const OptSegment& g : segments) {
    const ParamInfo& p = param_at(model.param_infos(), g.param_offset);
    // Without ZeRO-1 the state is replicated over the data group.
    if (!is_writer(p, d.tp_rank) || (!sharded && dp_rank != 0)) continue;
    s.meta[p.name] = meta_of(p, d);
    const auto at = [&](const std::vector<float>& st) {
      return std::vector<float>(st.begin() + g.state_offset, st.begin() + g.state_offset + g.numel);
    };
    s.pieces.push_back({"m", p.name, g.param_offset - p.offset, at(m)});
    s.pieces.push_back({"v", p.name, g.param_offset - p.offset, at(v)});
  }
  return s;
}

FullTensors assemble_full(const std::vector<RankShard>& shards, const std::string& kind,
                          const std::set<std::string>& names, const std::string& path) {
  FullTensors full;
  std::map<std::string, int64_t> filled;
  for (const RankShard& s : shards)
    for (const ShardPiece& piece : s.pieces) {
      if (piece.kind != kind || (!names.empty() && !names.count(piece.name))) continue;
      const ShardMeta& m = s.meta.at(piece.name);
      ParamInfo p;
      p.name = piece.name;
      p.shape = m.shard_shape;
      p.full_shape = m.full_shape;
      p.split = split_from(m.split, path, piece.name);
      p.numel = shape_numel(m.shard_shape);
      FullTensor& f = full[piece.name];
      if (f.data.empty()) {
        f.shape = m.full_shape;
        f.data.assign(static_cast<size_t>(shape_numel(m.full_shape)), 0.0f);
      }
      // Replicated and row-split shards are contiguous in the full tensor: one copy.
      if (p.split == ParamSplit::kReplicated || p.split == ParamSplit::kRows) {
        const int64_t g0 = global_index(p, piece.local_begin, m.tp_rank, m.tp);
        const int64_t n = static_cast<int64_t>(piece.values.size());
        if (g0 < 0 || g0 + n > static_cast<int64_t>(f.data.size()))
          throw InputError(path, kind + ":" + piece.name, "elements inside the full shape");
        std::copy(piece.values.begin(), piece.values.end(), f.data.begin() + g0);
        filled[piece.name] += n;
        continue;
      }
      for (size_t i = 0; i < piece.values.size(); ++i) {
        const int64_t g =
            global_index(p, piece.local_begin + static_cast<int64_t>(i), m.tp_rank, m.tp);
        if (g < 0 || g >= static_cast<int64_t>(f.data.size()))
          throw InputError(path, kind + ":" + piece.name, "elements inside the full shape");
        f.data[static_cast<size_t>(g)] = piece.values[i];
      }
      filled[piece.name] += static_cast<int64_t>(piece.values.size());
    }
  for (const auto& [name, f] : full)
    if (filled[name] != static_cast<int64_t>(f.data.size()))
      throw InputError(path, kind + ":" + name,
                       "every element once: " + std::to_string(filled[name]) + " written of " +
                           std::to_string(f.data.size()));
  return full;
}

float shard_value(const ParamInfo& p, const FullTensor& f, int64_t local, int tp_rank, int tp) {
  const int64_t g = global_index(p, local, tp_rank, tp);
  // Rows past the stored tensor are vocabulary padding of a larger tensor-parallel size.
  return g < static_cast<int64_t>(f.data.size()) ? f.data[static_cast<size_t>(g)] : 0.0f;
}

void fill_params(const GptModel& model, const FullTensors& full, std::vector<float>& params,
                 const std::string& path) {
  const GptDims& d = model.dims();
  for (const ParamInfo& p : model.param_infos()) {
    auto it = full.find(p.name);
    if (it == full.end()) throw InputError(path, p.name, "a tensor for this parameter");
    check_compatible(p, it->second, path);
    for (int64_t i = 0; i < p.numel; ++i) {
      const int64_t g = global_index(p, i, d.tp_rank, d.tp);
      // Padded vocabulary rows stay zero whatever the file holds there.
      const bool pad = p.rows_initialised >= 0 && g / p.full_shape[1] >= p.rows_initialised;
      params[static_cast<size_t>(p.offset + i)] =
          pad ? 0.0f : shard_value(p, it->second, i, d.tp_rank, d.tp);
    }
  }
}

void fill_state(const GptModel& model, const FullTensors& full,
                const std::vector<OptSegment>& segments, std::vector<float>& state,
                const std::string& path) {
  const GptDims& d = model.dims();
  for (const OptSegment& g : segments) {
    const ParamInfo& p = param_at(model.param_infos(), g.param_offset);
    auto it = full.find(p.name);
    if (it == full.end()) throw InputError(path, p.name, "optimizer state for this parameter");
    check_compatible(p, it->second, path);
    for (int64_t i = 0; i < g.numel; ++i)
      state[static_cast<size_t>(g.state_offset + i)] =
          shard_value(p, it->second, g.param_offset - p.offset + i, d.tp_rank, d.tp);
  }
}

FullTensors to_hf_gpt2(const GptDims& d, const FullTensors& ours) {
  FullTensors hf;
  const auto get = [&](const std::string& n) -> const FullTensor& { return ours.at(n); };
  hf["transformer.wte.weight"] = first_rows(get("wte"), d.V);
  hf["transformer.wpe.weight"] = get("wpe");
  for (int l = 0; l < d.L; ++l) {
    const std::string o = "h." + std::to_string(l) + ".", h = "transformer." + o;
    for (const char* n :
         {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "attn.c_attn.bias",
          "attn.c_proj.bias", "mlp.c_fc.bias", "mlp.c_proj.bias"})
      hf[h + n] = get(o + n);
    // HF's Conv1D stores (in, out); ours is (out, in).
    for (const char* n :
         {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"})
      hf[h + n] = transpose(get(o + n));
  }
  hf["transformer.ln_f.weight"] = get("ln_f.weight");
  hf["transformer.ln_f.bias"] = get("ln_f.bias");
  hf["lm_head.weight"] =
      d.tie ? hf["transformer.wte.weight"] : first_rows(get("lm_head.weight"), d.V);
  return hf;
}

FullTensors from_hf_gpt2(const GptDims& d, const FullTensors& hf, const std::string& path) {
  const auto get = [&](const std::string& n, std::vector<int64_t> shape) -> const FullTensor& {
    auto it = hf.find(n);
    if (it == hf.end()) throw InputError(path, n, "a tensor of shape " + shape_string(shape));
    if (it->second.shape != shape)
      throw InputError(path, n,
                       "shape " + shape_string(shape) + " (from the config), found " +
                           shape_string(it->second.shape));
    return it->second;
  };
  const int64_t C = d.C, F = d.F;
  FullTensors o;
  o["wte"] = get("transformer.wte.weight", {d.V, C});
  o["wpe"] = get("transformer.wpe.weight", {d.S, C});
  for (int l = 0; l < d.L; ++l) {
    const std::string p = "h." + std::to_string(l) + ".", h = "transformer." + p;
    for (const char* n : {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias",
                          "attn.c_proj.bias", "mlp.c_proj.bias"})
      o[p + n] = get(h + n, {C});
    o[p + "attn.c_attn.bias"] = get(h + "attn.c_attn.bias", {3 * C});
    o[p + "mlp.c_fc.bias"] = get(h + "mlp.c_fc.bias", {F});
    o[p + "attn.c_attn.weight"] = transpose(get(h + "attn.c_attn.weight", {C, 3 * C}));
    o[p + "attn.c_proj.weight"] = transpose(get(h + "attn.c_proj.weight", {C, C}));
    o[p + "mlp.c_fc.weight"] = transpose(get(h + "mlp.c_fc.weight", {C, F}));
    o[p + "mlp.c_proj.weight"] = transpose(get(h + "mlp.c_proj.weight", {F, C}));
  }
  o["ln_f.weight"] = get("transformer.ln_f.weight", {C});
  o["ln_f.bias"] = get("transformer.ln_f.bias", {C});
  if (!d.tie) o["lm_head.weight"] = get("lm_head.weight", {d.V, C});
  return o;
}

}  // namespace strata

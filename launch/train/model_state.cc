#include "launch/train/model_state.h"

#include <algorithm>

#include "runtime/error.h"

namespace strata {
namespace {

// Reads the split of `p` (its full shape set) from the metadata's spelling.
void split_from(const std::string& s, const std::string& path, ParamInfo& p) {
  const int64_t rows = p.full_shape.empty() ? 0 : p.full_shape[0];
  if (!parse_param_split(s, rows, &p.split, &p.row_blocks))
    throw InputError(path, "meta:" + p.name,
                     "split replicated, rows, cols, qkv_rows or block_rows:R0,R1,… summing to " +
                         std::to_string(rows) + " rows, got " + s);
}

// The parameter whose flat range holds `offset` (segments never cross parameters).
const ParamInfo& param_at(const std::vector<ParamInfo>& infos, int64_t offset) {
  for (const ParamInfo& p : infos)
    if (offset >= p.offset && offset < p.offset + p.numel) return p;
  throw std::logic_error("optimizer segment outside the parameters");
}

bool is_writer(const ParamInfo& p, int tp_rank) {
  // The last stage's copy of a tied parameter is the first stage's parameter again; replicated
  // parameters are equal on every tensor rank.
  return !p.tied_copy && (p.split != ParamSplit::kReplicated || tp_rank == 0);
}

ShardMeta meta_of(const ParamInfo& p, const ParamLayout& l) {
  ShardMeta m;
  m.full_shape = p.full_shape;
  m.shard_shape = p.shape;
  m.split = split_spelling(p.split, p.row_blocks);
  m.tp_rank = p.split == ParamSplit::kReplicated ? 0 : l.tp_rank();
  m.tp = p.split == ParamSplit::kReplicated ? 1 : l.tp();
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

}  // namespace

RankShard make_rank_shard(const ParamLayout& layout, const std::vector<float>& params,
                          const std::vector<float>& m, const std::vector<float>& v,
                          const std::vector<OptSegment>& segments, int dp_rank, bool sharded,
                          const std::vector<float>* previous) {
  RankShard s;
  for (const ParamInfo& p : layout.infos()) {
    if (!is_writer(p, layout.tp_rank()) || dp_rank != 0) continue;
    s.meta[p.name] = meta_of(p, layout);
    s.pieces.push_back(
        {"param", p.name, 0,
         std::vector<float>(params.begin() + p.offset, params.begin() + p.offset + p.numel)});
    if (previous)
      s.pieces.push_back({"param_prev", p.name, 0,
                          std::vector<float>(previous->begin() + p.offset,
                                             previous->begin() + p.offset + p.numel)});
  }
  for (const OptSegment& g : segments) {
    const ParamInfo& p = param_at(layout.infos(), g.param_offset);
    // Without ZeRO-1 the state is replicated over the data group.
    if (!is_writer(p, layout.tp_rank()) || (!sharded && dp_rank != 0)) continue;
    s.meta[p.name] = meta_of(p, layout);
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
      split_from(m.split, path, p);
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

void fill_params(const ParamLayout& layout, const FullTensors& full, std::vector<float>& params,
                 const std::string& path) {
  const int tp = layout.tp(), tp_rank = layout.tp_rank();
  for (const ParamInfo& p : layout.infos()) {
    auto it = full.find(p.name);
    if (it == full.end()) throw InputError(path, p.name, "a tensor for this parameter");
    check_compatible(p, it->second, path);
    for (int64_t i = 0; i < p.numel; ++i) {
      const int64_t g = global_index(p, i, tp_rank, tp);
      // Padded vocabulary rows stay zero whatever the file holds there.
      const bool pad = p.rows_initialised >= 0 && g / p.full_shape[1] >= p.rows_initialised;
      params[static_cast<size_t>(p.offset + i)] =
          pad ? 0.0f : shard_value(p, it->second, i, tp_rank, tp);
    }
  }
}

void fill_state(const ParamLayout& layout, const FullTensors& full,
                const std::vector<OptSegment>& segments, std::vector<float>& state,
                const std::string& path) {
  for (const OptSegment& g : segments) {
    const ParamInfo& p = param_at(layout.infos(), g.param_offset);
    auto it = full.find(p.name);
    if (it == full.end()) throw InputError(path, p.name, "optimizer state for this parameter");
    check_compatible(p, it->second, path);
    for (int64_t i = 0; i < g.numel; ++i)
      state[static_cast<size_t>(g.state_offset + i)] =
          shard_value(p, it->second, g.param_offset - p.offset + i, layout.tp_rank(), layout.tp());
  }
}

}  // namespace strata

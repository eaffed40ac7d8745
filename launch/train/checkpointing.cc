#include "launch/train/checkpointing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "launch/config/model_shape.h"
#include "launch/train/model_state.h"
#include "models/hf_checkpoint.h"
#include "runtime/base/error.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/data/tokenizer.h"
#include "runtime/io/input_file.h"

namespace strata {
namespace {

// The Strata checkpoint model.init_from names: a checkpoint (its metadata.json; checked whole, as
// an explicit checkpoint.resume is), or a checkpoint.dir (its newest valid one; InputError when it
// holds none); nullopt for anything else (a Hugging Face directory or file).
std::optional<std::string> strata_checkpoint_at(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(path + "/metadata.json", ec))
    return select_checkpoint(std::nullopt, path, std::cerr);  // checked whole, or InputError
  if (!fs::is_directory(path, ec) || fs::exists(path + "/config.json", ec)) return std::nullopt;
  bool saves = fs::exists(path + "/latest", ec);
  for (const auto& e : fs::directory_iterator(path, ec))
    saves = saves || e.path().filename().string().rfind("iter_", 0) == 0;
  if (!saves) return std::nullopt;
  return checkpoint_or_newest(path, std::cerr);
}

// The run's data section as its run state records it, for strata eval --data on the checkpoint:
// paths absolute (eval may run from another folder), the tokenizer left out (the checkpoint
// holds a copy, which eval reads).
nlohmann::json recorded_data(const Config& cfg) {
  nlohmann::json d = cfg.resolved.at("data");
  const auto absolute = [](nlohmann::json& v) {
    if (v.is_string())
      v = std::filesystem::absolute(v.get<std::string>()).lexically_normal().string();
  };
  absolute(d["path"]);
  if (d["blend"].is_array())
    for (nlohmann::json& b : d["blend"]) absolute(b["path"]);
  d.erase("tokenizer");
  return d;
}

}  // namespace

Checkpointing::Checkpointing(const RunLayout& run, const ModelDescription& desc,
                             ProcessGroups& groups, Model& model, AdamW& opt, GradReducer& reducer,
                             Backend& be, bool lead)
    : run_(run),
      desc_(desc),
      groups_(groups),
      model_(model),
      opt_(opt),
      reducer_(reducer),
      be_(be),
      lead_(lead) {
  const CheckpointConfig& ck = run.cfg->checkpoint;
  if (ck.dir) {
    // One run per directory: rank 0 holds its lock for the run (every rank learns a refusal).
    // Rank 0 also reads the run's tokenizer, which every save carries (generate, eval and
    // export then need no data.tokenizer); the data source has loaded it already.
    CheckpointExtras extras;
    const std::optional<std::string>& tok = run.cfg->data.tokenizer;
    decide_on_rank0(*groups.host, [this, &ck, &tok, &extras]() -> std::string {
      std::error_code ec;
      if (std::filesystem::is_directory(*ck.dir, ec)) lock_ = std::make_unique<DirLock>(*ck.dir);
      if (tok)
        extras[kCheckpointTokenizerFiles[is_tokenizer_json(*tok) ? 0 : 1]] =
            read_input_file(*tok, kMaxTokenizerFileBytes);
      return "";
    });
    saver_ = std::make_unique<CheckpointSaver>(*groups.host, *ck.dir, ck.keep, ck.async);
    saver_->set_extras(std::move(extras));
  }
}

bool Checkpointing::due(int it) const {
  const CheckpointConfig& ck = run_.cfg->checkpoint;
  return ck.dir && ck.interval > 0 && it % ck.interval == 0;
}

int Checkpointing::next_save(int after, int last) const {
  const CheckpointConfig& ck = run_.cfg->checkpoint;
  const int every = ck.dir ? ck.interval : 0;
  return every > 0 ? std::min(last, (after / every + 1) * every) : last;
}

RunStart Checkpointing::restore() {
  const Config& cfg = *run_.cfg;
  const CheckpointConfig& ck = cfg.checkpoint;
  RunStart start;
  // Rank 0 chooses (and reports skipped checkpoints) so that every rank loads the same one.
  const std::string choice = decide_on_rank0(*groups_.host, [&ck]() -> std::string {
    // Partial saves of runs that died or failed (a full disk) would pile up, one per rerun.
    if (ck.dir)
      for (const std::string& p : remove_partial_saves(*ck.dir))
        std::fprintf(stderr, "warning: removed %s, left by a checkpoint save that did not finish\n",
                     p.c_str());
    std::ostringstream warn;
    const std::optional<std::string> sel = select_checkpoint(ck.dir, ck.resume, warn);
    if (!warn.str().empty()) std::fprintf(stderr, "%s", warn.str().c_str());
    return sel ? "ok:" + *sel : "none:";
  });
  ParamStore& params = model_.params();
  const ParamLayout& layout = params.layout();
  std::vector<float> hp(static_cast<size_t>(params.numel()));
  if (choice.rfind("ok:", 0) == 0) {
    const std::string path = choice.substr(3);
    // Each rank reads only the byte ranges of the tensors it holds (model_state.h).
    CheckpointReader c(path);
    check_model_shape(model_shape_json(cfg.model, desc_),
                      c.run_state().value("model", nlohmann::json::object()),
                      path + "/run_state.json", "config");
    load_params(layout, c, "param", hp);
    be_.upload(params.params(), hp.data());
    params.params_changed();
    if (!run_.flushes()) {
      // Both versions; a flushing schedule's checkpoint has one: W(k−1) = W(k), as W(−1) = W(0).
      start.previous_params = hp;
      if (c.has("param_prev")) load_params(layout, c, "param_prev", start.previous_params);
    }
    std::vector<float>().swap(hp);
    for (const char* k : {"m", "v"}) {
      Tensor& st = std::string(k) == "m" ? opt_.m() : opt_.v();
      std::vector<float> hs(static_cast<size_t>(st.numel()));
      load_state(layout, c, k, reducer_.optimizer_segments(), hs);
      be_.upload(st, hs.data());
    }
    // CheckpointReader checked these keys' presence and ranges.
    opt_.set_steps_taken(c.run_state().at("optimizer_steps").get<int>());
    start.iteration = c.run_state().at("iteration").get<int>();
    start.nonfinite_in_a_row = c.run_state().at("nonfinite_in_a_row").get<int>();
    if (lead_) std::printf("resumed from %s (iteration %d)\n", path.c_str(), start.iteration);
  } else if (cfg.model.init_from) {
    const std::string& path = *cfg.model.init_from;
    // A Strata checkpoint gives its weights alone (fine-tuning from a pretraining run, saved in
    // any layout): the optimizer, the iteration and the data start afresh.
    const std::string strata_checkpoint = decide_on_rank0(
        *groups_.host, [&path]() { return strata_checkpoint_at(path).value_or(""); });
    if (!strata_checkpoint.empty()) {
      CheckpointReader c(strata_checkpoint);
      check_model_shape(model_shape_json(cfg.model, desc_),
                        c.run_state().value("model", nlohmann::json::object()),
                        strata_checkpoint + "/run_state.json", "config");
      load_params(layout, c, "param", hp);
    } else {
      fill_params(layout, load_hf_model(cfg.model, path), hp, path);
    }
    be_.upload(params.params(), hp.data());
    params.params_changed();
    if (lead_) std::printf("initialised from %s\n", path.c_str());
  }
  return start;
}

bool Checkpointing::weights_finite() {
  ParamStore& params = model_.params();
  int32_t bad = std::isfinite(be_.sum_squares(params.params())) ? 0 : 1;
  groups_.host->all_reduce(&bad, 1, DType::kI32, ReduceOp::kMax);  // every rank decides alike
  return bad == 0;
}

void Checkpointing::save(int it, int nonfinite_in_a_row, const Tensor* previous) {
  // A diverged run's weights (a NaN or an infinity anywhere) are not a checkpoint to resume from:
  // the last finite one stays the latest.
  if (!weights_finite()) {
    if (lead_)
      std::fprintf(stderr,
                   "warning: iteration %d not saved: the weights hold non-finite values (the run "
                   "is diverging); the last checkpoint saved stays the latest\n",
                   it);
    return;
  }
  // A second save waits for the first (its wait counts as the first one's stall).
  publish(pending(), it);
  const auto t0 = std::chrono::steady_clock::now();
  const Config& cfg = *run_.cfg;
  ParamStore& params = model_.params();
  // The snapshot: each piece downloaded straight into its own buffer.
  RankShard shard = make_rank_shard(
      params.layout(), be_, params.params(), opt_.m(), opt_.v(), reducer_.optimizer_segments(),
      Replica{groups_.dp->rank(), groups_.edp_rank}, reducer_.sharded(), previous);
  nlohmann::json rs = {
      {"format", "strata-run-state-1"},
      {"iteration", it},
      {"optimizer_steps", opt_.steps_taken()},
      // Batch j is sampled from (seed, j): the next iteration's data needs nothing else.
      {"data_position", it},
      {"seed", cfg.train.seed},
      {"rng", "none: initialisation and data are pure functions of train.seed"},
      {"nonfinite_in_a_row", nonfinite_in_a_row},
      {"world_size", groups_.host->size()},
      {"model", model_shape_json(cfg.model, desc_)},
      {"parallel",
       {{"tensor", run_.layout.tensor},
        {"pipeline", run_.layout.pipeline},
        {"data", run_.layout.data},
        {"virtual_stages", run_.layout.virtual_stages},
        {"schedule", to_string(run_.layout.schedule)},
        {"sequence_parallel", run_.layout.sequence_parallel},
        {"distributed_optimizer", run_.layout.distributed_optimizer}}},
      {"train",
       {{"iterations", cfg.train.iterations},
        {"micro_batch_size", run_.layout.micro_batch_size},
        {"global_batch_size", cfg.train.global_batch_size}}},
      {"config_file", cfg.source_file}};
  rs["data"] = recorded_data(cfg);
  // Expert parallelism, recorded where it was used (run states before it have no key).
  if (run_.layout.expert > 1) rs["parallel"]["expert"] = run_.layout.expert;
  // Context parallelism likewise: it changes no weight's layout, but the run state says it.
  if (run_.layout.context > 1) rs["parallel"]["context"] = run_.layout.context;
  write_s_.push_back(0);
  stall_s_.push_back(0);
  const std::string dir = saver_->save(it, std::move(shard), std::move(rs));
  stall_s_.back() += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!dir.empty()) {
    published_at_.push_back(it);
    write_s_.back() = saver_->last_write_s();
    if (lead_) {
      std::printf("checkpoint %s (saved in %.1f ms)\n", dir.c_str(), 1e3 * stall_s_.back());
      std::fflush(stdout);
    }
  }
}

int64_t Checkpointing::pending() const {
  return saver_ ? saver_->pending() : -1;
}

bool Checkpointing::writing() const {
  return saver_ && saver_->writing();
}

void Checkpointing::publish_saved(int64_t saved, int at) {
  publish(saved, at);
}

void Checkpointing::finish(int at) {
  publish(pending(), at);
}

void Checkpointing::publish(int64_t save, int at) {
  if (save < 0 || save != pending()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string dir = saver_->publish(save);
  published_at_.push_back(at);
  stall_s_.back() += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  write_s_.back() = saver_->last_write_s();
  if (lead_) {
    std::printf("checkpoint %s (written in the background in %.1f ms; the training held %.1f ms)\n",
                dir.c_str(), 1e3 * write_s_.back(), 1e3 * stall_s_.back());
    std::fflush(stdout);
  }
}

}  // namespace strata

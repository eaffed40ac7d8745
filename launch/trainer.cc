#include "launch/trainer.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "launch/cmd_plan.h"
#include "launch/config_parse.h"
#include "launch/model_state.h"
#include "models/gpt.h"
#include "runtime/backend.h"
#include "runtime/check.h"
#include "runtime/checkpoint.h"
#include "runtime/comm.h"
#include "runtime/data.h"
#include "runtime/error.h"
#include "runtime/grad_reducer.h"
#include "runtime/metrics.h"
#include "runtime/optimizer.h"
#include "runtime/pipeline.h"
#include "runtime/process_groups.h"
#include "runtime/safetensors.h"
#include "schedules/schedule.h"
#include "schedules/simulator.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string si(double v) {
  char buf[32];
  if (v >= 1e12) std::snprintf(buf, sizeof buf, "%.2f T", v / 1e12);
  else if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2f G", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2f M", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1f k", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f ", v);
  return buf;
}

// Sum of a double over a group (float on the wire: the figures summed here are losses and
// squared norms, for which float's 1e-7 relative rounding is far inside 1e-5). A group of device
// tensors (NCCL, staged) takes the value through a one-element tensor of the backend.
double sum_over(Backend& be, Communicator* c, double v) {
  if (!c || c->size() == 1) return v;
  float f = static_cast<float>(v);
  if (c->device() == Device::kCPU) {
    c->all_reduce(&f, 1, DType::kF32, ReduceOp::kSum);
    return f;
  }
  Tensor t = be.empty({1}, MemCategory::kBuffers);
  be.upload(t, &f);
  c->all_reduce(t, ReduceOp::kSum);
  be.download(&f, t);  // after the compute stream, which the reduction's wait ordered
  return f;
}

}  // namespace

nlohmann::json planner_prediction(const Config& cfg, int world_size) {
  const nlohmann::json cluster = {
      {"name", "this-machine"},
      {"nodes", 1},
      {"gpus_per_node", world_size},
      {"peak_flops", {{"fp32", 1e11}, {"bf16", 1e11}}},
      {"memory_bytes", std::max<int64_t>(1, physical_memory_bytes() / std::max(1, world().local_size))},
      {"hbm_bandwidth", 2e10},
      {"intra_node", {{"bandwidth", 1e10}, {"latency_s", 2e-6}}},
      {"inter_node", {{"bandwidth", 1.25e9}, {"latency_s", 2e-5}}},
      {"nics_per_node", 1}};
  return predict_for_config(cfg, world_size, cluster_from_json(cluster, "<this machine>"));
}

namespace {

// Everything a run is made of, built once from the config.
struct Run {
  const Config& cfg;
  RunContext ctx;
  const World& w;
  int tensor = 1, pipeline = 1, data = 1;
  int threads = 1;
  GptDims dims;
  int micro = 0;         // sequences per micro-batch
  int global = 0;        // sequences per iteration
  int seq_len = 0;
  int accumulation = 0;  // micro-batches per iteration on this rank

  Run(const Config& c, const RunContext& x)
      : cfg(c), ctx(x), w(x.single_process ? solo_world() : world()) {
    validate_for_world(cfg, w.size);
    tensor = cfg.parallel.tensor;
    pipeline = cfg.parallel.pipeline;
    data = data_parallel_size(cfg, w.size);
    threads = resolve_cpu_threads(cfg.train.threads, w.local_size);
    micro = cfg.train.micro_batch_size;
    global = cfg.train.global_batch_size;
    seq_len = cfg.model.seq_len;
    accumulation = microbatches_per_pipeline(cfg, w.size);
    // The tensor rank of this process, from the group layout (the same formula as the groups).
    const int tp_rank = group_layout(tensor, pipeline, data).coord(w.rank).tp;
    dims = gpt_dims(cfg.model, tensor, tp_rank, cfg.parallel.sequence_parallel);
    dims.bf16 = cfg.train.precision == "bf16";
  }

  // Refuses, before the model is allocated, a run whose predicted peak (the largest stage's,
  // partitioner/ memory model) does not fit in the memory its ranks share: the host's for
  // the CPU (a tenth left to the OS and the data), the GPU's for CUDA (ranks per device).
  // device_bytes: the GPU's memory (Backend::device_memory_bytes), 0 for the host's.
  void check_fits_in_memory(int64_t device_bytes) const {
    const nlohmann::json plan = planner_prediction(cfg, w.size);  // keep it alive for the loop
    double peak = 0;
    for (const auto& st : plan.at("predicted").at("memory_bytes_per_stage"))
      peak = std::max(peak, st.at("total").get<double>());
    const int64_t per_rank = static_cast<int64_t>(peak);
    const bool gpu = device_bytes > 0;
    const int devices = std::max(1, cuda_device_count());
    const int sharing = gpu ? (w.local_size + devices - 1) / devices : w.local_size;
    const int64_t need = per_rank * sharing;
    const int64_t have = gpu ? device_bytes : physical_memory_bytes();
    if (have > 0 && need > have / 10 * 9) {
      throw InputError(cfg.source_file, "model",
                       std::string("a model that fits in ") +
                           (gpu ? "the GPU's memory" : "this machine's memory") +
                           ": training needs " + format_bytes(need) + " (" +
                           std::to_string(sharing) + " rank(s) × " + format_bytes(per_rank) +
                           "), the " + (gpu ? "GPU" : "machine") + " has " + format_bytes(have));
    }
  }

  static const World& solo_world() {
    static const World solo = [] {
      World s;
      s.host = world().host;
      return s;
    }();
    return solo;
  }

  // Where the run's tensors live: the device make_backend() picks for cfg.device.
  Device tensor_device() const { return backend_device(cfg.device); }
  // The pipeline schedule of a training batch (2bw: of the whole run, which never flushes).
  ScheduleSpec train_spec() const {
    ScheduleKind kind = ScheduleKind::kOneFOneB;
    parse_schedule_kind(cfg.parallel.schedule, &kind);
    ScheduleSpec spec;
    spec.kind =
        pipeline == 1 && kind == ScheduleKind::kInterleaved ? ScheduleKind::kOneFOneB : kind;
    spec.stages = pipeline;
    spec.microbatches = accumulation;
    spec.chunks = spec.kind == ScheduleKind::kInterleaved ? cfg.parallel.virtual_stages : 1;
    spec.batches = kind == ScheduleKind::kTwoBW ? std::max(1, cfg.train.iterations) : 1;
    return spec;
  }
  // How tensors on `d` travel between ranks (NCCL, MPI, or MPI staged through host memory).
  // A pipeline schedule that needs buffered sends (2bw, and interleaved with micro-batch
  // groups larger than p: runs_on_rendezvous_sends, simulator.h) does not run on NCCL, whose
  // sends wait for their receive, so it keeps them on staged MPI.
  Transport transport(Device d) const {
    const ScheduleSpec spec = train_spec();
    const bool buffered =
        pipeline > 1 && schedule_invalid_reason(spec).empty() && !runs_on_rendezvous_sends(spec);
    return choose_transport(d, w.size, w.local_size, cuda_device_count(),
                            backend_available(CommBackend::kNCCL), buffered);
  }

  // The groups carrying be's tensors, ordered after be's compute stream. Create be first: the
  // groups may hold its staging and stream until they are destroyed.
  ProcessGroups groups(Backend& be) const {
    const std::shared_ptr<DeviceStaging> staging = be.comm_staging();
    if (ctx.single_process) return make_single_process_groups(cfg.comm.timeout_s, staging);
    const Transport t = transport(be.device());
    ProcessGroups g = make_process_groups(tensor, pipeline, data, t.backend, cfg.comm.timeout_s,
                                          t.staged ? staging : nullptr);
    g.set_compute_stream(be.compute_stream());
    return g;
  }
  // Host-only groups, for the dry run (no device is touched).
  ProcessGroups host_groups() const {
    if (ctx.single_process) return make_single_process_groups(cfg.comm.timeout_s);
    return make_process_groups(tensor, pipeline, data,
                               w.size > 1 ? CommBackend::kMPI : CommBackend::kLocal,
                               cfg.comm.timeout_s);
  }
};

struct Batch {
  Tensor tokens;   // (B, S) i32
  Tensor targets;  // (B, S) i32
};

// One micro-batch's data as the source writes it, before it goes to the device.
struct HostBatch {
  std::vector<int32_t> inputs, targets;  // (count, seq_len)
};

struct BatchKey {
  Split split;
  uint64_t iter;
  int64_t first;
  int count, seq_len;
  bool operator==(const BatchKey& o) const {
    return split == o.split && iter == o.iter && first == o.first && count == o.count &&
           seq_len == o.seq_len;
  }
};

HostBatch sample_batch(const DataSource& data, const BatchKey& k) {
  HostBatch h;
  h.inputs.resize(static_cast<size_t>(k.count) * static_cast<size_t>(k.seq_len));
  h.targets.resize(h.inputs.size());
  data.sample(k.split, k.iter, k.first, k.count, k.seq_len, h.inputs.data(), h.targets.data());
  return h;
}

// Samples the next micro-batch on a host thread while the device computes the current one.
// On a GPU, sampling on the critical path left the device idle: 10.9 ms of a 46 ms GPT-2 124M
// step on an H100 (synthetic source, CUPTI timeline). DataSource::sample is a pure function of
// its arguments, so a prefetched batch is the batch; a guess that is not asked for next (the
// last batch of training, an evaluation in between) is dropped and the batch sampled in place.
class BatchPrefetcher {
 public:
  explicit BatchPrefetcher(const DataSource& data) : data_(data) {}
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;
  ~BatchPrefetcher() { drop(); }

  HostBatch take(const BatchKey& k) {
    if (pending_.valid() && key_ == k) return pending_.get();  // rethrows the source's error
    drop();
    return sample_batch(data_, k);
  }
  void prefetch(const BatchKey& k) {
    drop();
    key_ = k;
    const DataSource* data = &data_;
    pending_ = std::async(std::launch::async, [data, k] { return sample_batch(*data, k); });
  }

 private:
  void drop() {
    if (!pending_.valid()) return;
    pending_.wait();
    pending_ = std::future<HostBatch>();  // an unused guess's error is not this batch's
  }
  const DataSource& data_;
  BatchKey key_{};
  std::future<HostBatch> pending_;
};

Batch upload_batch(Backend& be, const HostBatch& h, int count, int seq_len) {
  Batch b;
  b.tokens = be.empty({count, seq_len}, MemCategory::kActivations, DType::kI32);
  b.targets = be.empty({count, seq_len}, MemCategory::kActivations, DType::kI32);
  be.upload(b.tokens, h.inputs.data());
  be.upload(b.targets, h.targets.data());
  return b;
}

std::vector<ParamSpan> param_spans(const GptModel& model) {
  std::vector<ParamSpan> s;
  for (const ParamInfo& p : model.param_infos()) {
    // A parameter replicated over the tensor group has the same gradient on every member: its
    // squares count once, on tensor rank 0.
    // The last stage's copy of a tied embedding is the first stage's parameter again.
    const bool counted =
        (p.split != ParamSplit::kReplicated || model.dims().tp_rank == 0) && !p.tied_copy;
    s.push_back({p.offset, p.numel, p.decay, counted});
  }
  return s;
}

// The model keys that fix parameter shapes: a checkpoint loads only into the same values.
nlohmann::json model_shape_json(const ModelConfig& m) {
  return {{"arch", m.arch},
          {"num_layers", m.num_layers},
          {"hidden_size", m.hidden_size},
          {"num_heads", m.num_heads},
          {"ffn_hidden_size", m.ffn_hidden_size},
          {"seq_len", m.seq_len},
          {"vocab_size", m.vocab_size},
          {"tie_embeddings", m.tie_embeddings}};
}

void check_model_shape(const ModelConfig& m, const nlohmann::json& saved, const std::string& path) {
  const nlohmann::json want = model_shape_json(m);
  std::string diff;
  for (const auto& [key, value] : want.items()) {
    const nlohmann::json got = saved.contains(key) ? saved.at(key) : nlohmann::json();
    if (got == value) continue;
    diff += (diff.empty() ? "" : ", ") + key + " (checkpoint " + got.dump() + ", config " +
            value.dump() + ")";
  }
  if (!diff.empty())
    throw InputError(path + "/run_state.json", "model",
                     "the model shape of the config; differing keys: " + diff);
}

// Test hook (documented in docs/checkpoints.md): STRATA_TEST_KILL_AT_ITER=<K> makes world rank 1
// (rank 0 in a one-rank job) SIGKILL itself as iteration K starts, as a node failure would.
void maybe_kill_at(int it, const World& w) {
  const char* s = std::getenv("STRATA_TEST_KILL_AT_ITER");
  if (s && std::atoi(s) == it && w.rank == (w.size > 1 ? 1 : 0)) ::raise(SIGKILL);
}

void keep_metrics_up_to(const std::string& path, int iteration) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("iter", iteration + 1) <= iteration) kept += line + "\n";
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

FullTensors read_full_f32(const std::string& path) {
  const StFile f = read_safetensors(path);
  FullTensors t;
  // Other dtypes (a fixture's token ids) are not parameters.
  for (const auto& [name, st] : f.tensors)
    if (st.dtype == "F32") t[name] = {st.shape, st.as_f32()};
  return t;
}

}  // namespace

int64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

void print_dry_run(const Config& cfg, const RunContext& ctx, std::ostream& os) {
  Run run(cfg, ctx);
  ProcessGroups g = run.host_groups();
  const bool cuda = run.tensor_device() == Device::kCUDA;
  const std::string table =
      rank_table(g, cuda ? "cuda:" + std::to_string(local_device_index()) : "cpu");
  // (The GPU's memory is not known without the device: a CUDA run checks it when it starts.)
  if (run.tensor_device() == Device::kCPU) run.check_fits_in_memory(0);
  if (run.w.rank != 0) return;
  const GptDims& d = run.dims;
  int64_t n = 0;
  for (const ParamInfo& p : GptModel::layout(d)) n += p.numel;
  const int64_t real = GptModel::real_parameters(gpt_dims(cfg.model));
  const FlopCount f = GptModel::flops_per_iteration(d, run.global, run.seq_len,
                                                    cfg.train.recompute == "full");
  const nlohmann::json plan = planner_prediction(cfg, run.w.size);
  const nlohmann::json& stages = plan.at("predicted").at("memory_bytes_per_stage");
  os << "model: " << d.L << " layers, hidden " << d.C << ", " << d.NH << " heads, ffn " << d.F
     << ", seq " << d.S << ", vocab " << d.V << " (padded " << d.Vp << ")\n";
  os << "parameters: " << real << " (" << si(static_cast<double>(real)) << "), " << n
     << " on each rank (tensor " << run.tensor << ")\n";
  os << "parallel: tensor " << run.tensor << " × pipeline " << run.pipeline << " × data "
     << run.data << " = " << run.w.size << " ranks"
     << (cfg.parallel.sequence_parallel ? ", sequence parallel" : "")
     << (cfg.parallel.distributed_optimizer ? ", distributed optimizer" : "") << "\n";
  if (run.w.size > 1)
    os << "tensors between ranks: " << to_string(run.transport(run.tensor_device())) << "\n";
  os << "batch: global " << run.global << " sequences = " << run.accumulation
     << " micro-batches of " << run.micro << " × data " << run.data << " ("
     << static_cast<int64_t>(run.global) * run.seq_len << " tokens per iteration)\n";
  os << "FLOPs per iteration: model " << si(f.model) << "FLOP, hardware " << si(f.hardware)
     << "FLOP\n";
  // The planner's memory model (partitioner/), which follows the schedule's in-flight
  // micro-batches per stage; tests/mpi_test_memory.cc checks it against the allocator.
  os << "predicted memory per rank, by pipeline stage:\n";
  const char* kinds[] = {"parameters", "gradients", "optimizer", "activations", "buffers",
                         "total"};
  os << "  stage";
  for (const char* k : kinds) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " %13s", k);
    os << buf;
  }
  os << "\n";
  for (size_t st = 0; st < stages.size(); ++st) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "  %5zu", st);
    os << buf;
    for (const char* k : kinds) {
      std::snprintf(buf, sizeof buf, " %13s",
                    format_bytes(static_cast<int64_t>(stages[st].at(k).get<double>())).c_str());
      os << buf;
    }
    os << "\n";
  }
  os << "ranks:\n" << table;
}

namespace {

// What one optimizer step saw, the same on every rank.
struct StepRecord {
  int batch = 0;     // 0-based
  double loss = 0;   // mean over the global batch
  double norm = 0;   // global gradient norm before clipping
  double lr = 0;
  bool finite = true;
  double at_s = 0;   // when the step finished, seconds from the start of the run
};

// One pipeline stage of the GPT on this rank: the compute side of the executor's instructions.
//
// PipeDream-2BW (two_bw): micro-batches are numbered across batches (batch b = mb / m) and batch
// b runs forward and backward on weight version W(max(b−1, 0)); step j computes
// W(j+1) = W(j) − update(∇f at W(j−1)) into the buffer of W(j−1), which no micro-batch uses
// any more. Version k lives in versions_[k % 2]: at most two versions are ever held.
class GptStage final : public PipelineStage {
 public:
  GptStage(const Run& run, GptModel& model, Backend& be, const DataSource& data,
           ProcessGroups& groups, GradReducer& reducer, AdamW& opt, int pieces_total, bool two_bw)
      : run_(run), model_(model), be_(be), data_(data), groups_(groups), reducer_(reducer),
        opt_(opt), pieces_total_(pieces_total), two_bw_(two_bw) {
    versions_[0] = model_.params();
  }

  // Starts batch `iter` (0-based) of `split` (2bw: the first of the batches the list covers);
  // training or forward-only evaluation.
  void begin(Split split, uint64_t iter, bool training) {
    split_ = split;
    iter_ = iter;
    training_ = training;
    loss_by_batch_.clear();
    batches_.clear();
  }
  // Σ token losses of this stage's forwards of batch `b` (relative to begin()).
  double loss_sum(int b = 0) const {
    auto it = loss_by_batch_.find(b);
    return it == loss_by_batch_.end() ? 0.0 : it->second;
  }
  const std::vector<StepRecord>& records() const { return records_; }
  void set_clock(Clock::time_point t0) { t0_ = t0; }
  // The newest weights (what evaluation and the final parameters use).
  const Tensor& newest_params() const { return versions_[steps_ % 2]; }

  Shape boundary_shape() const override {
    return {run_.micro, run_.dims.seq_local(run_.seq_len), run_.dims.C};
  }
  DType boundary_dtype() const override { return model_.activation_dtype(); }

  Tensor forward(int mb, int chunk, const Tensor& input) override {
    use_version_of(mb);
    const Batch& b = batch(mb);
    double loss = 0;
    GptModel::ActsPtr acts = model_.forward_piece(chunk, input, b.tokens, b.targets, &loss);
    loss_by_batch_[mb / run_.accumulation] += loss;
    const bool last_piece = piece_index(chunk) == pieces_total_ - 1;
    Tensor out = last_piece ? Tensor() : GptModel::output(*acts);
    if (training_) acts_[{mb, chunk}] = std::move(acts);
    return out;
  }

  Tensor backward(int mb, int chunk, const Tensor& grad_output) override {
    auto it = acts_.find({mb, chunk});
    STRATA_CHECK(it != acts_.end(), "backward of micro-batch " << mb << " chunk " << chunk
                                                               << " before its forward");
    GptModel::ActsPtr acts = std::move(it->second);
    acts_.erase(it);
    use_version_of(mb);
    return model_.backward_piece(*acts, grad_output, grad_scale(), last_of_batch(mb));
  }

  // Zero-bubble split: the B pass computes input gradients (sent on at once), the W pass the
  // matrix weight gradients later, filling the pipeline bubble. The activations stay alive
  // from F to W.
  Tensor backward_input(int mb, int chunk, const Tensor& grad_output) override {
    auto it = acts_.find({mb, chunk});
    STRATA_CHECK(it != acts_.end(), "backward-input of micro-batch " << mb << " chunk " << chunk
                                                                     << " before its forward");
    use_version_of(mb);
    return model_.backward_piece(*it->second, grad_output, grad_scale(), last_of_batch(mb),
                                 /*defer_weight_grads=*/true);
  }
  void backward_weight(int mb, int chunk) override {
    auto it = acts_.find({mb, chunk});
    STRATA_CHECK(it != acts_.end(), "backward-weight of micro-batch " << mb << " chunk " << chunk
                                                                      << " before its B pass");
    use_version_of(mb);
    model_.backward_weight_piece(*it->second, last_of_batch(mb));
    acts_.erase(it);
  }

  void reduce_grads() override {
    // Tied embedding split over the first and last stage: sum the two copies' gradients.
    if (groups_.pipeline > 1 && run_.dims.tie && groups_.embedding &&
        groups_.embedding->size() > 1) {
      Tensor g = model_.grad("wte");
      groups_.embedding->all_reduce(g, ReduceOp::kSum);
      const int i = model_.param_index("wte");
      reducer_.mark_ready(i, i + 1);
    }
    reducer_.finish();
  }

  void optimizer_step() override {
    StepRecord r;
    r.batch = static_cast<int>(iter_) + steps_in_list_;
    const double tokens = static_cast<double>(run_.global) * run_.seq_len;
    r.loss = sum_over(be_, groups_.dp.get(),
                      sum_over(be_, groups_.pp.get(), loss_sum(steps_in_list_))) /
             tokens;
    double sq = reducer_.local_sum_squares();
    if (reducer_.sharded()) sq = sum_over(be_, groups_.dp.get(), sq);
    r.norm = std::sqrt(sum_over(be_, groups_.mp.get(), sq));
    r.lr = learning_rate(run_.cfg.optimizer, run_.cfg.train.iterations, r.batch + 1);
    r.finite = std::isfinite(r.norm) && std::isfinite(r.loss);
    // W(j+1) goes into the buffer of W(j−1) (2bw), or over W(j) (flushing schedules).
    Tensor& current = versions_[steps_ % 2];
    Tensor* next = &current;
    if (two_bw_) {
      Tensor& other = versions_[(steps_ + 1) % 2];
      if (!other.defined()) other = be_.empty({current.numel()}, MemCategory::kParameters);
      be_.copy(other, current);
      next = &other;
    }
    if (r.finite) {  // a non-finite step is skipped: the weights stay (the caller counts)
      // Clipping rides in the AdamW kernel: no pass of its own over the gradients.
      const double coef = clip_coefficient(r.norm, run_.cfg.optimizer.grad_clip);
      opt_.step(*next, reducer_.optimizer_grads(), r.lr, coef);
      reducer_.gather_params(*next);
      model_.params_changed();  // bf16: the compute copy follows the master weights
    }
    if (two_bw_) {
      ++steps_;
      // The next batch's gradients accumulate from zero while the pipeline keeps running.
      model_.zero_grads();
      reducer_.begin_iteration();
    }
    ++steps_in_list_;
    r.at_s = std::chrono::duration<double>(Clock::now() - t0_).count();
    records_.push_back(r);
  }

  void switch_weights() override {}  // versions are chosen per micro-batch (use_version_of)

  void reset_list() { steps_in_list_ = 0; }

 private:
  int piece_index(int chunk) const { return chunk * groups_.pipeline + groups_.pp_rank; }
  bool last_of_batch(int mb) const { return mb % run_.accumulation == run_.accumulation - 1; }
  // 2bw: point the model at W(max(b−1, 0)) for micro-batch mb of batch b.
  void use_version_of(int mb) {
    if (!two_bw_) return;
    const int b = static_cast<int>(iter_) + mb / run_.accumulation;
    model_.use_params(versions_[std::max(b - 1, 0) % 2]);
  }
  float grad_scale() const {
    return static_cast<float>(1.0 / (static_cast<double>(run_.global) * run_.seq_len));
  }
  const Batch& batch(int mb) {
    auto it = batches_.find(mb);
    if (it != batches_.end()) return it->second;
    // Earlier micro-batches of this rank are done with their data once a later batch starts.
    const int m = run_.accumulation;
    for (auto old = batches_.begin(); old != batches_.end() && old->first / m < mb / m - 1;)
      old = batches_.erase(old);
    const HostBatch host = prefetcher_.take(batch_key(mb));
    prefetcher_.prefetch(batch_key(mb + 1));  // the next micro-batch, or the next batch's first
    return batches_[mb] = upload_batch(be_, host, run_.micro, run_.seq_len);
  }
  // Micro-batch mb is slot mb % m of batch iter + mb / m (2bw numbers them across batches).
  BatchKey batch_key(int mb) const {
    const int m = run_.accumulation;
    const int64_t first = static_cast<int64_t>(groups_.dp_rank) * (run_.global / run_.data) +
                          static_cast<int64_t>(mb % m) * run_.micro;
    return {split_, iter_ + static_cast<uint64_t>(mb / m), first, run_.micro, run_.seq_len};
  }

  const Run& run_;
  GptModel& model_;
  Backend& be_;
  const DataSource& data_;
  ProcessGroups& groups_;
  GradReducer& reducer_;
  AdamW& opt_;
  int pieces_total_;
  bool two_bw_;
  Split split_ = Split::kTrain;
  uint64_t iter_ = 0;
  bool training_ = true;
  std::map<int, double> loss_by_batch_;  // [batch − iter_] Σ token losses on this stage
  std::vector<StepRecord> records_;
  int steps_ = 0;          // 2bw: optimizer steps taken (W(steps_) is the newest version)
  int steps_in_list_ = 0;  // steps taken in the current instruction list
  Tensor versions_[2];     // 2bw: W(k) in versions_[k % 2]; flushing: versions_[0] only
  Clock::time_point t0_ = Clock::now();
  std::map<int, Batch> batches_;                           // [mb] this batch's data
  BatchPrefetcher prefetcher_{data_};                      // the next micro-batch's data
  std::map<std::pair<int, int>, GptModel::ActsPtr> acts_;  // [(mb, chunk)] awaiting backward
};

// Forward-only instructions for evaluation: every micro-batch through this stage's chunks in
// model order (sends never block, so no stage can wait on a later one).
std::vector<Instr> forward_only(int stage, int p, int v, int m) {
  std::vector<Instr> list;
  for (int mb = 0; mb < m; ++mb)
    for (int c = 0; c < v; ++c) {
      if (prev_piece(stage, c, p, v).stage >= 0) list.push_back({Op::kRecvActivation, mb, c, -1});
      list.push_back({Op::kForward, mb, c, -1});
      if (next_piece(stage, c, p, v).stage >= 0) list.push_back({Op::kSendActivation, mb, c, -1});
    }
  return list;
}

std::string trace_events_json(const std::vector<std::pair<double, PipelineEvent>>& events,
                              int rank) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& [offset, e] : events) {
    arr.push_back({{"name", instr_string({e.op, e.mb, e.chunk, -1})},
                   {"cat", to_string(e.op)},
                   {"ph", "X"},
                   {"pid", 0},
                   {"tid", rank},
                   {"ts", (offset + e.start_s) * 1e6},
                   {"dur", (e.end_s - e.start_s) * 1e6}});
  }
  return arr.dump();
}

}  // namespace

std::vector<int> layers_per_piece(const Config& cfg) {
  const int n = cfg.parallel.pipeline * cfg.parallel.virtual_stages;
  if (cfg.parallel.layers_per_stage) return *cfg.parallel.layers_per_stage;  // validated sums
  // Even split; the first L % n pieces take one more layer (the last piece also carries the
  // LM head, the heaviest single layer, so extra layers go to the front).
  std::vector<int> v(static_cast<size_t>(n), cfg.model.num_layers / n);
  for (int k = 0; k < cfg.model.num_layers % n; ++k) ++v[static_cast<size_t>(k)];
  return v;
}

TrainResult run_training(const Config& cfg, const RunContext& ctx) {
  Run run(cfg, ctx);
  std::unique_ptr<Backend> backend =
      make_backend(cfg.device, run.threads, cfg.train.attention_backend);
  Backend& be = *backend;
  run.check_fits_in_memory(be.device_memory_bytes());
  ProcessGroups groups = run.groups(be);
  std::unique_ptr<DataSource> data =
      make_data_source(cfg.data, cfg.train.seed, run.seq_len, cfg.source_file);
  if (data->vocab_size() > cfg.model.vocab_size) {
    throw InputError(cfg.source_file, "model.vocab_size",
                     "at least the data's vocabulary " + std::to_string(data->vocab_size()) +
                         ", got " + std::to_string(cfg.model.vocab_size));
  }
  const bool lead = run.w.rank == 0 && ctx.verbose;
  Communicator* dp = groups.dp.get();
  const int p = run.pipeline, v = cfg.parallel.virtual_stages, m = run.accumulation;

  // This stage's pieces of the model: chunk c is piece c·p + stage.
  const std::vector<int> split = layers_per_piece(cfg);
  std::vector<int> first(split.size() + 1, 0);
  for (size_t k = 0; k < split.size(); ++k) first[k + 1] = first[k] + split[k];
  std::vector<ModelPiece> pieces;
  for (int c = 0; c < v; ++c) {
    const int k = c * p + groups.pp_rank;
    pieces.push_back({first[static_cast<size_t>(k)], split[static_cast<size_t>(k)], k == 0,
                      k == p * v - 1});
  }

  GptModel model(run.dims, be, cfg.train.seed, groups.tp.get(), pieces,
                 parse_recompute(cfg.train.recompute));
  GradReducer reducer(be, dp, model.grads(), param_spans(model), cfg.parallel.bucket_mb,
                      cfg.parallel.distributed_optimizer);
  AdamW opt(be, cfg.optimizer, reducer.optimizer_segments());
  model.set_grad_ready_hook([&](int a, int b) { reducer.mark_ready(a, b); });
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  parse_schedule_kind(cfg.parallel.schedule, &kind);
  const bool two_bw_run = kind == ScheduleKind::kTwoBW;
  GptStage stage(run, model, be, *data, groups, reducer, opt, p * v, two_bw_run);
  PipelineExecutor exec(*groups.pp, be, groups.pp_rank, p, v);

  const bool two_bw = two_bw_run;
  const ScheduleSpec spec = run.train_spec();
  if (const std::string why = schedule_invalid_reason(spec); !why.empty())
    throw InputError(cfg.source_file, "parallel.schedule", why);
  const std::vector<Instr> train_list = build_schedule(spec, groups.pp_rank);
  const std::vector<Instr> eval_list = forward_only(groups.pp_rank, p, v, m);

  // Checkpoints (runtime/checkpoint.h): resume from one, or start from model.init_from.
  const CheckpointConfig& ck = cfg.checkpoint;
  const bool saving = ck.dir && ck.interval > 0;
  const bool resume_path = ck.resume != "auto" && ck.resume != "none";
  if (two_bw && (ck.dir || resume_path))
    throw InputError(cfg.source_file, "checkpoint",
                     "no checkpoint settings with parallel.schedule 2bw: its second weight "
                     "version is not saved yet (set checkpoint.dir to null or use a flushing "
                     "schedule)");
  int start_iter = 0;
  int nonfinite_in_a_row = 0;
  {
    // Rank 0 chooses (and reports skipped checkpoints) so that every rank loads the same one.
    std::string choice;
    if (run.w.rank == 0 || ctx.single_process) {
      try {
        std::ostringstream warn;
        const std::optional<std::string> sel = select_checkpoint(ck.dir, ck.resume, warn);
        if (!warn.str().empty()) std::fprintf(stderr, "%s", warn.str().c_str());
        choice = sel ? "ok:" + *sel : "none:";
      } catch (const InputError& e) {
        // The parts travel separately so every rank rethrows the same InputError (exit 2).
        choice = "err:" + e.file() + '\n' + e.where() + '\n' + e.expected();
      }
    }
    choice = all_gather_strings(*groups.host, choice)[0];
    if (choice.rfind("err:", 0) == 0) {
      const size_t a = choice.find('\n'), b = choice.find('\n', a + 1);
      throw InputError(choice.substr(4, a - 4), choice.substr(a + 1, b - a - 1),
                       choice.substr(b + 1));
    }
    std::vector<float> hp(static_cast<size_t>(model.num_parameters()));
    if (choice.rfind("ok:", 0) == 0) {
      const std::string path = choice.substr(3);
      const LoadedCheckpoint c = read_checkpoint(path);
      check_model_shape(cfg.model, c.run_state.value("model", nlohmann::json::object()), path);
      std::set<std::string> names;
      for (const ParamInfo& pi : model.param_infos()) names.insert(pi.name);
      fill_params(model, assemble_full(c.shards, "param", names, path), hp, path);
      be.upload(model.params(), hp.data());
      model.params_changed();
      for (const char* k : {"m", "v"}) {
        Tensor& st = std::string(k) == "m" ? opt.m() : opt.v();
        std::vector<float> hs(static_cast<size_t>(st.numel()));
        fill_state(model, assemble_full(c.shards, k, names, path), reducer.optimizer_segments(),
                   hs, path);
        be.upload(st, hs.data());
      }
      opt.set_steps_taken(c.run_state.value("optimizer_steps", 0));
      start_iter = c.run_state.value("iteration", 0);
      nonfinite_in_a_row = c.run_state.value("nonfinite_in_a_row", 0);
      if (lead) std::printf("resumed from %s (iteration %d)\n", path.c_str(), start_iter);
    } else if (cfg.model.init_from) {
      const std::string& path = *cfg.model.init_from;
      fill_params(model, from_hf_gpt2(gpt_dims(cfg.model), read_full_f32(path), path), hp, path);
      be.upload(model.params(), hp.data());
      model.params_changed();
      if (lead) std::printf("initialised from %s\n", path.c_str());
    }
  }
  auto save = [&](int it) {
    std::vector<float> hp(static_cast<size_t>(model.num_parameters()));
    std::vector<float> hm(static_cast<size_t>(opt.m().numel())), hv(hm.size());
    be.download(hp.data(), model.params());
    be.download(hm.data(), opt.m());
    be.download(hv.data(), opt.v());
    const RankShard shard = make_rank_shard(model, hp, hm, hv, reducer.optimizer_segments(),
                                            groups.dp_rank, reducer.sharded());
    nlohmann::json rs = {
        {"format", "strata-run-state-1"},
        {"iteration", it},
        {"optimizer_steps", opt.steps_taken()},
        // Batch j is sampled from (seed, j): the next iteration's data needs nothing else.
        {"data_position", it},
        {"seed", cfg.train.seed},
        {"rng", "none: initialisation and data are pure functions of train.seed"},
        {"nonfinite_in_a_row", nonfinite_in_a_row},
        {"world_size", groups.host->size()},
        {"model", model_shape_json(cfg.model)},
        {"parallel", {{"tensor", run.tensor}, {"pipeline", p}, {"data", run.data},
                      {"virtual_stages", v}, {"schedule", cfg.parallel.schedule},
                      {"sequence_parallel", cfg.parallel.sequence_parallel},
                      {"distributed_optimizer", cfg.parallel.distributed_optimizer}}},
        {"train", {{"iterations", cfg.train.iterations},
                   {"micro_batch_size", cfg.train.micro_batch_size},
                   {"global_batch_size", cfg.train.global_batch_size}}},
        {"config_file", cfg.source_file}};
    const std::string dir = save_checkpoint(*groups.host, *ck.dir, it, shard, rs, ck.keep);
    if (lead) {
      std::printf("checkpoint %s\n", dir.c_str());
      std::fflush(stdout);
    }
  };

  std::unique_ptr<MetricsWriter> metrics;
  if (cfg.log.metrics && run.w.rank == 0) {
    // A resumed run continues the file: it keeps the lines up to the checkpoint's iteration and
    // drops those a killed run wrote after it (they are about to be recomputed).
    if (start_iter > 0) keep_metrics_up_to(*cfg.log.metrics, start_iter);
    metrics = std::make_unique<MetricsWriter>(*cfg.log.metrics, start_iter > 0, cfg.source_file);
  }

  TrainResult res;
  res.pipeline_rank = groups.pp_rank;
  res.loss_floor = data->loss_floor(run.seq_len);
  // The schedule's idle share of the step with equal op times (schedules/simulator.h).
  res.theoretical_bubble = theoretical_bubble_fraction(spec);
  const int iters = cfg.train.iterations;
  const double tokens_per_iter = static_cast<double>(run.global) * run.seq_len;
  const FlopCount flops = GptModel::flops_per_iteration(run.dims, run.global, run.seq_len,
                                                        cfg.train.recompute == "full");
  if (lead) {
    std::printf("strata train: %s\n", cfg.source_file.c_str());
    std::printf("  backend  %s; %d rank(s): tensor %d × pipeline %d × data %d%s%s\n",
                be.name().c_str(), run.w.size, run.tensor, p, run.data,
                cfg.parallel.sequence_parallel ? ", sequence parallel" : "",
                reducer.sharded() ? ", distributed optimizer" : "");
    if (run.w.size > 1)
      std::printf("  comm     %s\n", to_string(run.transport(be.device())).c_str());
    if (p > 1)
      std::printf("  pipeline %s, %d micro-batches, %d chunk(s) per stage, layers per piece",
                  to_string(spec.kind), m, spec.chunks);
    if (p > 1) {
      for (int n : split) std::printf(" %d", n);
      std::printf("\n");
    }
    std::printf("  model    %d layers, hidden %d, %d heads, seq %d, vocab %d: %s parameters\n",
                run.dims.L, run.dims.C, run.dims.NH, run.dims.S, run.dims.V,
                si(static_cast<double>(GptModel::real_parameters(gpt_dims(cfg.model)))).c_str());
    std::printf("  data     %s\n", data->describe().c_str());
    if (res.loss_floor)
      std::printf("  floor    best achievable loss at seq %d: %.4f nats/token (entropy rate %.4f)\n",
                  run.seq_len, *res.loss_floor, data->entropy_rate().value_or(0));
    std::printf("  batch    %d sequences × %d tokens = %d micro-batches of %d × data %d; "
                "%d iterations\n",
                run.global, run.seq_len, m, run.micro, run.data, iters);
    std::fflush(stdout);
  }

  Communicator* pp = groups.pp.get();
  auto evaluate = [&]() {
    double sum = 0;
    for (int k = 0; k < cfg.train.eval_iters; ++k) {
      stage.begin(Split::kVal, static_cast<uint64_t>(k), false);
      exec.run(eval_list, stage);
      sum += stage.loss_sum();
    }
    return sum_over(be, dp, sum_over(be, pp, sum)) /
           (static_cast<double>(cfg.train.eval_iters) * tokens_per_iter);
  };

  std::vector<std::pair<double, PipelineEvent>> trace;
  double train_time = 0;
  const auto t_start = Clock::now();
  stage.set_clock(t_start);

  // Metrics, console line and evaluation of one optimizer step.
  auto report = [&](const StepRecord& r, double step_s, double bubble) {
    const int it = r.batch + 1;
    if (r.finite) {
      nonfinite_in_a_row = 0;
    } else {
      if (!cfg.train.skip_nonfinite)
        throw std::runtime_error("non-finite loss or gradient at iteration " +
                                 std::to_string(it) + " (train.skip_nonfinite is false)");
      if (++nonfinite_in_a_row >= 5)
        throw std::runtime_error("5 non-finite steps in a row (last at iteration " +
                                 std::to_string(it) + "): the run is diverging; lower "
                                 "optimizer.lr or check the data");
    }
    res.bubbles.push_back(bubble);
    res.step_s.push_back(step_s);
    IterationMetrics mt;
    mt.iter = it;
    mt.loss = r.loss;
    mt.lr = r.lr;
    mt.grad_norm = r.norm;
    mt.step_ms = step_s * 1e3;
    mt.tokens_per_s = tokens_per_iter / step_s;
    mt.tflops_per_gpu = flops.hardware / step_s / run.w.size / 1e12;
    if (const std::optional<double> peak = be.peak_flops(cfg.train.precision))
      mt.mfu = flops.model / step_s / run.w.size / *peak;
    mt.bubble = bubble;
    mt.mem_peak_bytes = be.allocator().stats().total_peak;
    mt.skipped = !r.finite;
    // 2bw never flushes: it evaluates once, after the last step.
    const bool eval_now = cfg.train.eval_interval > 0 &&
                          (it == iters || (!two_bw && it % cfg.train.eval_interval == 0));
    if (eval_now) {
      mt.val_loss = evaluate();
      res.val_losses.emplace_back(it, *mt.val_loss);
    }
    res.losses.push_back(r.loss);
    res.grad_norms.push_back(r.norm);
    res.skipped.push_back(!r.finite);
    if (metrics) metrics->write(mt);
    if (lead && (it % cfg.log.interval == 0 || it == 1 || it == iters || eval_now)) {
      std::printf("iter %5d/%d | loss %.4f%s | lr %.2e | gnorm %.3f | %7.1f ms | %s tok/s | "
                  "%sFLOP/s | mem %s",
                  it, iters, r.loss, r.finite ? "" : " (skipped)", mt.lr, r.norm, mt.step_ms,
                  si(mt.tokens_per_s).c_str(), si(flops.hardware / step_s).c_str(),
                  format_bytes(mt.mem_peak_bytes).c_str());
      if (p > 1) std::printf(" | bubble %.2f (theory %.2f)", bubble, res.theoretical_bubble);
      if (mt.val_loss) std::printf(" | val %.4f", *mt.val_loss);
      std::printf("\n");
      std::fflush(stdout);
    }
  };
  auto keep_timeline = [&](Clock::time_point t0) {
    res.bucket_start_s = reducer.bucket_start_s();
    double bwd_end = 0;
    for (const PipelineEvent& e : exec.events())
      if (e.op == Op::kBackward || e.op == Op::kBackwardInput) bwd_end = std::max(bwd_end, e.end_s);
    res.backward_end_s = bwd_end;
    if (cfg.log.trace)
      for (const PipelineEvent& e : exec.events())
        trace.emplace_back(std::chrono::duration<double>(t0 - t_start).count(), e);
  };

  if (two_bw && iters > 0) {
    // One instruction list for the whole run: the pipeline never flushes between batches.
    be.allocator().reset_peak();
    model.zero_grads();
    reducer.begin_iteration();
    stage.begin(Split::kTrain, 0, true);
    stage.reset_list();
    exec.run(train_list, stage);
    be.synchronize();
    train_time = seconds_since(t_start);
    keep_timeline(t_start);
    const double bubble = std::max(0.0, 1.0 - exec.compute_s() / train_time);
    // Evaluation and the final parameters use the newest version.
    model.use_params(stage.newest_params());
    double previous = 0;
    for (const StepRecord& r : stage.records()) {
      report(r, r.at_s - previous, bubble);
      previous = r.at_s;
    }
  } else if (!two_bw) {
    for (int it = start_iter + 1; it <= iters; ++it) {
      maybe_kill_at(it, run.w);
      const auto t0 = Clock::now();
      be.allocator().reset_peak();
      model.zero_grads();
      reducer.begin_iteration();
      // The data index is the optimizer step (0-based) and the slot in the global batch, so
      // any split of the batch into micro-batches, stages or ranks sees the same sequences.
      stage.begin(Split::kTrain, static_cast<uint64_t>(it - 1), true);
      stage.reset_list();
      exec.run(train_list, stage);
      be.synchronize();
      const double step_s = seconds_since(t0);
      train_time += step_s;
      keep_timeline(t0);
      report(stage.records().back(), step_s,
             std::max(0.0, 1.0 - exec.compute_s() / step_s));
      if (saving && it % ck.interval == 0) save(it);
    }
  }
  res.wall_s = seconds_since(t_start);
  res.start_iteration = start_iter;
  res.tokens_per_s = train_time > 0 ? tokens_per_iter * (iters - start_iter) / train_time : 0;
  res.memory = be.allocator().stats();
  res.final_params.resize(static_cast<size_t>(model.num_parameters()));
  be.download(res.final_params.data(), model.params());

  if (cfg.log.trace) {
    // One Chrome trace for the job: every rank's events on its own track (tid = world rank).
    const std::vector<std::string> parts =
        all_gather_strings(*groups.host, trace_events_json(trace, run.w.rank));
    if (run.w.rank == 0) {
      std::ofstream out(*cfg.log.trace);
      if (!out) throw InputError(cfg.source_file, "log.trace", "a writable file path");
      out << "{\"traceEvents\": [";
      bool first_event = true;
      for (const std::string& part : parts) {
        const nlohmann::json arr = nlohmann::json::parse(part);
        for (const auto& e : arr) {
          out << (first_event ? "\n" : ",\n") << e.dump();
          first_event = false;
        }
      }
      out << "\n], \"displayTimeUnit\": \"ms\"}\n";
    }
  }

  if (lead && iters > start_iter) {
    std::printf("done: %d iterations in %.1f s | final loss %.4f", iters, res.wall_s,
                res.losses.back());
    if (!res.val_losses.empty()) std::printf(" | val %.4f", res.val_losses.back().second);
    if (res.loss_floor) {
      const double last = res.val_losses.empty() ? res.losses.back() : res.val_losses.back().second;
      std::printf(" | floor %.4f (+%.4f nats)", *res.loss_floor, last - *res.loss_floor);
    }
    std::printf(" | %s tok/s | peak memory %s per rank\n", si(res.tokens_per_s).c_str(),
                format_bytes(res.memory.total_peak).c_str());
    std::fflush(stdout);
  }
  return res;
}

}  // namespace strata

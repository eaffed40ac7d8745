#include "launch/train/pipeline_stage.h"

#include <algorithm>
#include <cmath>

#include "models/registry.h"
#include "runtime/base/check.h"

namespace strata {

double sum_over(Backend& be, Communicator* c, double v) {
  PendingSum s;
  s.start(be, c, v);
  return s.wait();
}

double max_over(Backend& be, Communicator* c, double v) {
  PendingSum s;
  s.start(be, c, v, ReduceOp::kMax);
  return s.wait();
}

void PendingSum::start(Backend& be, Communicator* c, double v, ReduceOp op) {
  be_ = &be;
  alone_.reset();
  device_ = Tensor();
  if (!c || c->size() == 1) {
    alone_ = v;
    return;
  }
  host_ = static_cast<float>(v);
  if (c->device() == Device::kCPU) {
    req_ = c->iall_reduce(&host_, 1, DType::kF32, op);
    return;
  }
  device_ = be.empty({1}, MemCategory::kBuffers);
  be.upload(device_, &host_);
  req_ = c->iall_reduce(device_, op);
}

bool PendingSum::test() {
  return alone_.has_value() || req_.test();
}

double PendingSum::wait() {
  if (alone_) return *alone_;
  req_.wait();
  if (device_.defined()) be_->download(&host_, device_);  // after the compute stream
  return host_;
}

std::vector<ParamSpan> param_spans(const ParamStore& params) {
  std::vector<ParamSpan> s;
  const int tp_rank = params.layout().tp_rank();
  for (const ParamInfo& p : params.infos()) {
    const bool counted = (p.split != ParamSplit::kReplicated || tp_rank == 0) && !p.tied_copy;
    s.push_back({p.offset, p.numel, p.decay, counted, p.experts});
  }
  return s;
}

ModelStage::ModelStage(const RunLayout& run, Model& model, Backend& be, const DataSource& data,
                       ProcessGroups& groups, GradReducer& reducer, AdamW& opt)
    : run_(run),
      model_(model),
      be_(be),
      data_(data),
      groups_(groups),
      reducer_(reducer),
      opt_(opt),
      two_versions_(!run.flushes()),
      moe_(model_spec(run.cfg->model).block.mlp.is_moe()) {
  versions_[0] = model_.params().params();
}

void ModelStage::resume(int steps, const std::vector<float>& previous) {
  if (!two_versions_) return;  // the model holds W(steps), all a flushing schedule needs
  const Tensor newest = model_.params().params();
  Tensor prev = be_.empty({newest.numel()}, MemCategory::kParameters);
  STRATA_CHECK(static_cast<int64_t>(previous.size()) == newest.numel(),
               "2bw resume: " << previous.size() << " older weights for " << newest.numel());
  be_.upload(prev, previous.data());
  versions_[steps % 2] = newest;
  versions_[(steps + 1) % 2] = prev;
  steps_ = steps;
}

void ModelStage::begin(Split split, uint64_t iter, bool training) {
  split_ = split;
  iter_ = iter;
  training_ = training;
  loss_by_batch_.clear();
  batches_.clear();
}

double ModelStage::loss_sum(int b) const {
  auto it = loss_by_batch_.find(b);
  return it == loss_by_batch_.end() ? 0.0 : it->second.sum;
}

double ModelStage::loss_tokens(int b) const {
  return data_.loss_tokens(split_, iter_ + static_cast<uint64_t>(b), 0, run_.global, run_.seq_len);
}

Shape ModelStage::boundary_shape() const {
  const Shape act = model_.boundary_shape(run_.layout.micro_batch_size, run_.seq_len);
  if (model_.boundary_stats() == 0) return act;
  // The activation (or its gradient) and, behind it, the statistics' bytes as elements of the
  // boundary type (Model::boundary_stats).
  return {shape_numel(act) + stats_elements()};
}

int64_t ModelStage::stats_elements() const {
  return static_cast<int64_t>(model_.boundary_stats() * sizeof(double) /
                              dtype_size(model_.activation_dtype()));
}

Tensor ModelStage::boundary_part(const Tensor& received, std::vector<double>* stats) const {
  const Shape act = model_.boundary_shape(run_.layout.micro_batch_size, run_.seq_len);
  const int64_t n = shape_numel(act);
  stats->assign(static_cast<size_t>(model_.boundary_stats()), 0.0);
  be_.download(stats->data(), received.view(n, {stats_elements()}));
  return received.view(0, act);
}

Tensor ModelStage::with_stats(const Tensor& t, const std::vector<double>& stats) const {
  const int64_t n = t.numel();
  Tensor out = be_.empty({n + stats_elements()}, MemCategory::kActivations, t.dtype());
  Tensor head = out.view(0, t.shape());
  be_.copy(head, t);
  Tensor tail = out.view(n, {stats_elements()});
  be_.upload(tail, stats.data());
  return out;
}

Tensor ModelStage::forward(int mb, int chunk, const Tensor& input) {
  progress();
  use_version_of(mb);
  const ModelBatch& b = batch(mb);
  LossSum loss;
  // A mixture's balancing statistics travel beside the activations (Model::boundary_stats).
  const bool stats = model_.boundary_stats() > 0;
  std::vector<double> in, out(static_cast<size_t>(model_.boundary_stats()));
  const Tensor x = stats && input.defined() ? boundary_part(input, &in) : input;
  PieceActsPtr acts = model_.forward_piece(chunk, x, b, &loss);
  if (stats) model_.forward_stats(*acts, in.empty() ? nullptr : in.data(), out.data(), &loss);
  LossSum& sum = loss_by_batch_[mb / run_.layout.num_microbatches];
  sum.sum += loss.sum;
  sum.count += loss.count;
  sum.aux += loss.aux;
  sum.expert_load = std::max(sum.expert_load, loss.expert_load);
  const bool last_piece = piece_index(chunk) == run_.layout.pieces() - 1;
  Tensor y = last_piece ? Tensor() : model_.piece_output(*acts);
  if (stats && y.defined()) y = with_stats(y, out);
  if (training_) acts_[{mb, chunk}] = std::move(acts);
  return y;
}

Tensor ModelStage::backward_piece(PieceActs& acts, int mb, const Tensor& grad_output,
                                  bool defer_weight_grads) {
  if (model_.boundary_stats() == 0)
    return model_.backward_piece(acts, grad_output, grad_scale(mb), last_of_batch(mb),
                                 defer_weight_grads);
  std::vector<double> in, out(static_cast<size_t>(model_.boundary_stats()));
  const Tensor dy = grad_output.defined() ? boundary_part(grad_output, &in) : grad_output;
  model_.backward_stats(acts, in.empty() ? nullptr : in.data(), out.data());
  const Tensor dx =
      model_.backward_piece(acts, dy, grad_scale(mb), last_of_batch(mb), defer_weight_grads);
  return dx.defined() ? with_stats(dx, out) : dx;
}

PieceActsPtr ModelStage::take_acts(int mb, int chunk, const char* what) {
  auto it = acts_.find({mb, chunk});
  STRATA_CHECK(it != acts_.end(),
               what << " of micro-batch " << mb << " chunk " << chunk << " before its forward");
  PieceActsPtr acts = std::move(it->second);
  acts_.erase(it);
  return acts;
}

Tensor ModelStage::backward(int mb, int chunk, const Tensor& grad_output) {
  progress();
  PieceActsPtr acts = take_acts(mb, chunk, "backward");
  use_version_of(mb);
  return backward_piece(*acts, mb, grad_output, false);
}

Tensor ModelStage::backward_input(int mb, int chunk, const Tensor& grad_output) {
  auto it = acts_.find({mb, chunk});
  STRATA_CHECK(it != acts_.end(), "backward-input of micro-batch " << mb << " chunk " << chunk
                                                                   << " before its forward");
  use_version_of(mb);
  return backward_piece(*it->second, mb, grad_output, /*defer_weight_grads=*/true);
}

void ModelStage::backward_weight(int mb, int chunk) {
  PieceActsPtr acts = take_acts(mb, chunk, "backward-weight");
  use_version_of(mb);
  model_.backward_weight_piece(*acts, last_of_batch(mb));
}

void ModelStage::reduce_grads() {
  const std::vector<ParamInfo>& infos = model_.params().infos();
  if (two_versions_) {
    // Start what the step of this batch needs from other stages and ranks, and run on: the
    // next batch accumulates into the other gradient buffer (docs/schedules.md).
    STRATA_CHECK(step_.phase == DeferredStep::Phase::kIdle,
                 "2bw: the step of batch " << step_.batch << " is still open at the next one's");
    const int b = steps_in_list_;
    check_loss_tokens(b);
    step_.batch = b;
    step_.loss.start(be_, groups_.pp.get(), loss_sum(b));
    for (int i = 0; i < static_cast<int>(infos.size()); ++i) {
      if (!infos[static_cast<size_t>(i)].tied) continue;
      step_.tied.push_back(tied_group(infos[static_cast<size_t>(i)])
                               ->iall_reduce(model_.params().grad(ParamRef{i}), ReduceOp::kSum));
      step_.tied_params.push_back(i);
    }
    ParamStore& params = model_.params();
    if (!grad_buffers_[0].defined()) grad_buffers_[0] = params.grads();
    Tensor& next = grad_buffers_[params.grads().data() == grad_buffers_[0].data() ? 1 : 0];
    if (!next.defined()) next = be_.empty({params.numel()}, MemCategory::kGradients);
    params.use_grads(next);
    params.zero_grads();
    step_.phase = DeferredStep::Phase::kTied;
    advance_step(false);
    return;
  }
  // Parameters held by two stages (a tied embedding): sum the two holders' gradients.
  for (int i = 0; i < static_cast<int>(infos.size()); ++i) {
    if (!infos[static_cast<size_t>(i)].tied) continue;
    Tensor g = model_.params().grad(ParamRef{i});
    tied_group(infos[static_cast<size_t>(i)])->all_reduce(g, ReduceOp::kSum);
    reducer_.mark_ready(i, i + 1);
  }
  reducer_.finish();
}

Communicator* ModelStage::tied_group(const ParamInfo& p) const {
  STRATA_CHECK(
      groups_.embedding && groups_.embedding->size() > 1,
      "parameter " << p.name << " is tied across stages but this rank has no embedding group");
  return groups_.embedding.get();
}

void ModelStage::check_loss_tokens(int b) const {
  if (!model_.pieces().back().head) return;
  const int per_rank = run_.global / run_.layout.data;
  const double mine =
      data_.loss_tokens(split_, iter_ + static_cast<uint64_t>(b),
                        static_cast<int64_t>(groups_.dp_rank) * per_rank, per_rank, run_.seq_len);
  const auto it = loss_by_batch_.find(b);
  // With context parallelism the data rank's sequences are counted over its context group.
  const double counted =
      sum_over(be_, groups_.cp.get(), it == loss_by_batch_.end() ? 0.0 : it->second.count);
  STRATA_CHECK(it != loss_by_batch_.end() && counted == mine,
               "the loss counted " << counted << " tokens where the data has " << mine);
}

bool ModelStage::progress() {
  return step_.phase != DeferredStep::Phase::kIdle && advance_step(false);
}

bool ModelStage::advance_step(bool block) {
  using Phase = DeferredStep::Phase;
  DeferredStep& d = step_;
  // The loss sum runs beside the chain. MPI moves a non-blocking collective on only while it is
  // tested (left alone, its completion waited for the step: 14 ms a batch here), so every call
  // tests it too.
  const bool loss_done = d.loss.test();
  if (d.phase == Phase::kTied) {
    for (Request& r : d.tied) {
      if (block) r.wait();
      if (!r.test()) return true;
    }
    d.tied.clear();
    // Then over the data group, as the blocking step does.
    for (int i : d.tied_params) reducer_.mark_ready(i, i + 1);
    d.tied_params.clear();
    d.phase = Phase::kData;
  }
  if (d.phase == Phase::kData) {
    if (!block && !reducer_.test()) return true;
    reducer_.finish();
    const double sq = reducer_.local_sum_squares();
    const bool shard = reducer_.norm_sums_over_data();
    d.sq.start(be_, shard ? groups_.dp.get() : groups_.mp.get(), sq);
    d.phase = shard ? Phase::kShardNorm : Phase::kNorm;
  }
  if (d.phase == Phase::kShardNorm) {
    if (!block && !d.sq.test()) return true;
    const double sq = d.sq.wait();
    d.sq.start(be_, groups_.mp.get(), sq);
    d.phase = Phase::kNorm;
  }
  if (d.phase == Phase::kNorm) {
    if (!block && !d.sq.test()) return true;
    d.phase = Phase::kReady;
  }
  return !loss_done;
}

void ModelStage::optimizer_step() {
  StepRecord r;
  r.batch = static_cast<int>(iter_) + steps_in_list_;
  const int b = steps_in_list_;
  const auto waiting = std::chrono::steady_clock::now();
  if (two_versions_) {
    // Complete what reduce_grads() started (mostly done by now, while the pipeline ran).
    STRATA_CHECK(step_.phase != DeferredStep::Phase::kIdle && step_.batch == b,
                 "2bw: the step of batch " << b << " before its ReduceGrads");
    advance_step(true);
    r.loss = sum_over(be_, groups_.dp.get(), step_.loss.wait()) / loss_tokens(b);
    r.norm = std::sqrt(step_.sq.wait());
  } else {
    check_loss_tokens(b);
    r.loss = sum_over(be_, groups_.dp.get(), sum_over(be_, groups_.pp.get(), loss_sum(b))) /
             loss_tokens(b);
    double sq = reducer_.local_sum_squares();
    if (reducer_.norm_sums_over_data()) sq = sum_over(be_, groups_.dp.get(), sq);
    r.norm = std::sqrt(sum_over(be_, groups_.mp.get(), sq));
  }
  if (moe_) {
    // A mixture of experts: the balancing term averaged over the global batch's micro-batches,
    // the worst layer's load over every micro-batch (the piece holding the MoE layers reports
    // them; other pieces add 0). Context ranks each hold the whole micro-batch's term (their
    // statistics are summed over the context group): dp sums it c times.
    const auto it = loss_by_batch_.find(b);
    const LossSum mine = it == loss_by_batch_.end() ? LossSum{} : it->second;
    r.aux_loss = sum_over(be_, groups_.dp.get(), sum_over(be_, groups_.pp.get(), mine.aux)) /
                 (run_.layout.num_microbatches * run_.layout.data * run_.layout.context);
    r.expert_load =
        max_over(be_, groups_.dp.get(), max_over(be_, groups_.pp.get(), mine.expert_load));
  }
  r.wait_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - waiting).count();
  r.lr = learning_rate(run_.cfg->optimizer, run_.cfg->train.iterations, r.batch + 1);
  r.finite = std::isfinite(r.norm) && std::isfinite(r.loss);
  ParamStore& params = model_.params();
  // W(j+1) goes into the buffer of W(j−1) (2bw), or over W(j) (flushing schedules).
  Tensor& current = versions_[steps_ % 2];
  Tensor* next = &current;
  if (two_versions_) {
    Tensor& other = versions_[(steps_ + 1) % 2];
    if (!other.defined()) other = be_.empty({current.numel()}, MemCategory::kParameters);
    be_.copy(other, current);
    next = &other;
  }
  if (r.finite) {  // a non-finite step is skipped: the weights stay (the caller counts)
    // Clipping rides in the AdamW kernel: no pass of its own over the gradients.
    const double coef = clip_coefficient(r.norm, run_.cfg->optimizer.grad_clip);
    opt_.step(*next, reducer_.optimizer_grads(), r.lr, coef);
    reducer_.gather_params(*next);
    params.params_changed();  // bf16: the compute copy follows the master weights
  }
  if (on_step_) on_step_(r.batch + 1, *next);
  if (two_versions_) {
    ++steps_;
    // The reducer takes the buffer the next batch has been accumulating into.
    reducer_.use_grads(params.grads());
    reducer_.begin_iteration();
    step_.phase = DeferredStep::Phase::kIdle;
  }
  ++steps_in_list_;
  r.at_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  records_.push_back(r);
}

// 2bw: point the model at W(max(b−1, 0)) for micro-batch mb of training batch b; evaluation
// runs on the newest weights (iter_ is then the validation batch's index, not a step).
void ModelStage::use_newest_weights() {
  if (two_versions_) model_.params().use_params(newest_params());
}

void ModelStage::use_version_of(int mb) {
  if (!two_versions_) return;
  if (!training_) {
    model_.params().use_params(newest_params());
    return;
  }
  const int b = static_cast<int>(iter_) + mb / run_.layout.num_microbatches;
  model_.params().use_params(versions_[std::max(b - 1, 0) % 2]);
}

float ModelStage::grad_scale(int mb) const {
  return static_cast<float>(1.0 / loss_tokens(mb / run_.layout.num_microbatches));
}

const ModelBatch& ModelStage::batch(int mb) {
  auto it = batches_.find(mb);
  if (it != batches_.end()) return it->second;
  // Earlier micro-batches of this rank are done with their data once a later batch starts.
  const int m = run_.layout.num_microbatches;
  for (auto old = batches_.begin(); old != batches_.end() && old->first / m < mb / m - 1;)
    old = batches_.erase(old);
  HostBatch host = prefetcher_.take(batch_key(mb));
  prefetcher_.prefetch(batch_key(mb + 1));  // the next micro-batch, or the next batch's first
  // A sentence loss (BERT's) weighs the tokens that count per sequence of the global batch. With
  // context parallelism it counts on context rank 0, which holds [CLS] (the others weigh it 0).
  double sentence_weight = loss_tokens(mb / m) / run_.global;
  int seq_len = run_.seq_len;
  if (groups_.context > 1) {
    host = context_part(host, run_.layout.micro_batch_size, run_.seq_len, groups_.context,
                        groups_.cp_rank);
    seq_len /= groups_.context;
    if (groups_.cp_rank != 0) sentence_weight = 0;
  }
  return batches_[mb] =
             upload_batch(be_, host, run_.layout.micro_batch_size, seq_len, sentence_weight);
}

// Micro-batch mb is slot mb % m of batch iter + mb / m (2bw numbers them across batches).
BatchKey ModelStage::batch_key(int mb) const {
  const int m = run_.layout.num_microbatches;
  const int64_t first = static_cast<int64_t>(groups_.dp_rank) * (run_.global / run_.layout.data) +
                        static_cast<int64_t>(mb % m) * run_.layout.micro_batch_size;
  return {split_, iter_ + static_cast<uint64_t>(mb / m), first, run_.layout.micro_batch_size,
          run_.seq_len};
}

}  // namespace strata

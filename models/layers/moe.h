// moe.h — the mixture-of-experts MLP (Mixtral's MixtralSparseMoeBlock, Qwen3-MoE's
// Qwen3MoeSparseMoeBlock): a router, top-k dispatch, E SwiGLU experts and a weighted combine.
//
//   logits = x · routerᵀ                          (N, E), router (E, C) replicated
//   p      = softmax(logits)                      (N, E), f32
//   idx, w = top-k of p (ties: the lower expert), w ← w / Σ w when renormalize (Mixtral always,
//            Qwen3-MoE when norm_topk_prob)
//   y_n    = Σ_j w_nj · expert_{idx_nj}(x_n),     expert_e(x) = down_e(silu(gate_e x) · up_e x)
//
// Dispatch (runtime/backend/backend.h moe_*): the (token, slot) assignments are laid out expert
// after expert, in token order within an expert; the experts run as one grouped GEMM over those
// rows. Dropless by default; with a capacity factor cf, expert e keeps at most
// ceil(cf · N · k / E) assignments, those of the largest w (ties: the lower token), as
// Megatron-Core's "probs" drop policy does; a dropped assignment contributes nothing (its token
// keeps its residual and its other experts).
//
// The load-balancing loss (Hugging Face's load_balancing_loss_func, Switch Transformer's term)
// couples every MoE layer of the model over one micro-batch of N tokens:
//   aux = E · Σ_e f_e · P_e,  f_e = Σ_layers routed_e / (L·N),  P_e = Σ_layers Σ_n p_ne / (L·N)
// (routed_e: assignments to e before any drop). The layer reports its routed counts and Σ_n p
// (Stats); the model sums them over its layers. Its gradient reaches p as one value per expert,
// coef · E · f_e / L per token (times the backward's scale), which the model hands to each layer's
// backward (Saved::aux_grad).
//
// Tensor parallelism (Megatron-Core's, without expert parallelism): every expert's F hidden units
// are split over the tensor group as a dense MLP's are — gate/up column-parallel (a rank holds
// [gate_r; up_r] of every expert), down row-parallel — and the router is replicated. Every rank
// routes the whole (gathered, with sequence parallelism) micro-batch identically; the combined
// output is a partial sum reduced like a row-parallel layer's (all-reduce, or reduce-scatter with
// sp) before the residual joins. Backward: d(w) = dout · y is a partial sum too, all-reduced over
// the group (N·k values) so that the router's backward, identical on every rank, needs no further
// sum; its input gradient joins the experts' partial one on tensor rank 0 only, before their
// reduction.
//
// Parameters (full shapes): `router`.weight (E, C); `experts_gate_up`.weight (E·2F, C), expert e's
// rows [gate_e (F); up_e (F)] (ParamSplit::kBlockRows over 2E blocks of F); `experts_down`.weight
// (E·C, F), expert e's rows [e·C, (e+1)·C) (ParamSplit::kCols). No biases.
//
// Expert parallelism (Megatron-Core's all-to-all dispatcher; LayerEnv::ep, e ranks): a rank holds
// experts [j·E/e, (j+1)·E/e) of every MoE layer (ParamDecl::expert) and routes its own tokens.
// After the dispatch plan, the rows of the experts of rank j are one contiguous run of the
// expert-major layout; the counts per expert travel first (an all-to-all of E/e counts per
// peer), then the rows (an uneven all-to-all), and the rows received — source rank after source
// rank, expert after expert within each — are sorted expert after expert (source rank order
// within an expert) for the grouped GEMMs. The outputs are unsorted and travel back the same way
// before the combine. The backward sends the combine's row gradients along the same path and the
// experts' input gradients back. With tensor parallelism each tensor rank exchanges with its own
// expert group (the same tensor rank of the other data ranks) the whole routed rows and computes
// its F/t slice of its experts, so the two compose as Megatron-Core's expert tensor parallelism
// equal to the tensor size does. Routing, capacity drops and the balancing loss are per
// micro-batch on the rank that holds the tokens, as without expert parallelism, so every layout
// computes the same function of the same micro-batches. Context parallelism splits a
// micro-batch's tokens over the context group: the model sums the layers' Stats over it
// (transformer.cc), and a capacity is refused.
//
// Zero-bubble schedules: the experts' and router's weight gradients are computed in the B pass
// (not deferred to the W pass).
//
// Thread-safety: as the model.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "models/layers/parallel.h"
#include "models/layers/params.h"
#include "models/layers/work.h"

namespace strata {

// The mixture of an MLP slot (MlpSpec::moe); experts == 0 is a dense MLP.
struct MoeSpec {
  int experts = 0;          // E (model.num_experts)
  int top_k = 2;            // k (model.num_experts_per_tok)
  int64_t hidden = 0;       // each expert's F (model.moe_intermediate_size)
  bool renormalize = true;  // the top-k weights divided by their sum (model.norm_topk_prob)
  double aux_coef = 0;      // model.router_aux_loss_coef
  std::optional<double> capacity_factor;  // null: dropless

  // Assignments an expert keeps of a micro-batch of `tokens` (−1: all, dropless).
  int64_t capacity(int64_t tokens) const;
};

// Parameter names (prefixes of `name`.weight) of an MoE layer.
struct MoeNames {
  std::string router, experts_gate_up, experts_down;
};

class MixtureOfExperts {
 public:
  // What the forward keeps (N = B·S tokens, R routed rows, F_l = F/t).
  struct Saved {
    Tensor x;                   // (N, C) the input over the whole sequence (gathered with sp)
    Tensor probs;               // (N, E) f32 softmax of the router's logits
    Tensor topk_idx, topk_w;    // (N, k) i32 and f32
    Tensor dest;                // (N, k) i32 the row of each assignment, −1 dropped
    std::vector<int64_t> rows;  // [E_l] rows per expert of this rank (after drops)
    Tensor xp;                  // (R, C) the rows the experts of this rank compute, expert order
    Tensor h;                   // (R, 2F_l) [gate | up] of each row
    Tensor act;                 // (R, F_l)
    Tensor y;  // (R_d, C) each routed row's expert output, in the dispatch order (a partial sum
               // over the tensor group); R_d = R without expert parallelism
    // Expert parallelism only: the rows sent to and received from each rank of the expert group
    // (in rows), and where each received row sits in the expert order of xp ((R, 1) i32).
    std::vector<size_t> sent, received;
    Tensor sort;
    // Set by the model before the backward: the load-balancing loss's gradient on every
    // token's p, per expert (E) f32; undefined when the loss is off.
    Tensor aux_grad;
  };
  // What a forward tells the model about its routing (the load-balancing loss and metrics).
  struct Stats {
    std::vector<double> routed;    // [E] assignments per expert before drops
    std::vector<double> prob_sum;  // [E] Σ over tokens of p
    int64_t tokens = 0;            // N
    int64_t dropped = 0;           // assignments dropped by the capacity
  };

  MixtureOfExperts() = default;
  MixtureOfExperts(ParamLayout& layout, const MoeSpec& spec, const MoeNames& names, int64_t C,
                   double init_std, double proj_init_std);

  // residual + moe(x); x (B, S_local, C) the normalised input. Fills *stats.
  Tensor forward(const LayerEnv& env, const Tensor& x, const Tensor& residual, Saved& s,
                 Stats* stats) const;
  // dresid (B, S_local, C) → the gradient of x (B, S_local, C), reduced over the group.
  Tensor backward(const LayerEnv& env, BackwardPass& pass, const Tensor& dresid, Saved& s) const;

  // ---- self-description (models/layers/work.h), for a hidden size C, with the tokens spread
  // evenly over the experts (k·N/E rows each) ----
  static PartWork work(int64_t C, const MoeSpec& m, const WorkShape& s);
  static LayerActivations activations(int64_t C, const MoeSpec& m, const WorkShape& s);
  // Forward FLOPs per token of the active experts and the router (2 per multiply-add).
  static double flops_per_token(int64_t C, const MoeSpec& m);
  static std::string split_reason(const MoeSpec& m, int t);  // "" when t divides F

  MoeSpec spec;
  ParamRef router, gate_up, down;
  int64_t C = 0;
  int64_t hidden_local = 0;   // F / t
  int ep = 1;                 // the expert group's size e
  int64_t experts_local = 0;  // E / e, this rank's experts

 private:
  // Expert parallelism: the routed rows xd (R_d, C) in dispatch order, sent_counts (E) of them
  // per expert, to the ranks holding their experts (received_counts (E): from source i, rows for
  // this rank's expert l at i·E_l + l); fills s.sent, s.received,
  // s.rows and s.sort and returns the rows received, sorted expert after expert.
  Tensor dispatch(const LayerEnv& env, const Tensor& xd, const std::vector<int32_t>& sent_counts,
                  const std::vector<int32_t>& received_counts, Saved& s) const;
  // The converse of dispatch for rows of the experts' order (R, C): unsorted and sent back to
  // the ranks that routed them, in their dispatch order (R_d, C).
  Tensor combine_rows(const LayerEnv& env, const Tensor& rows, const Saved& s) const;
  // Rows of the dispatch order (R_d, C) to the experts' ranks, sorted (the path of dispatch,
  // with its counts known).
  Tensor send_rows(const LayerEnv& env, const Tensor& rows, const Saved& s) const;
};

}  // namespace strata

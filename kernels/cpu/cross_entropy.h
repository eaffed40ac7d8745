// cross_entropy.h — CPU vocab-parallel cross-entropy: pure functions on raw row-major buffers.
//
// Every function is a template over the scalar type T, instantiated for float (training) and
// double (the reference that finite-difference tests evaluate). Loops use OpenMP.
// The CUDA kernels: kernels/cuda/cross_entropy.h.
//
// Thread-safety: functions touch only their arguments; concurrent calls on disjoint buffers are
// safe. They use the calling thread's OpenMP team, as set by set_num_threads() (threads.h).
#pragma once

#include <cstdint>

namespace strata::kernels::cpu {

// Vocab-parallel cross-entropy, in the steps Megatron-LM's takes so that no rank ever holds the
// full logits. logits (N, ld) hold this rank's vocabulary columns [vocab_start, vocab_start + ld)
// of which the first `valid` are real tokens (the rest is padding, excluded everywhere).
//   1. row_max (N)   = max over valid columns                  (then all-reduce max)
//   2. row_sumexp (N) = Σ exp(logit - row_max)                  (then all-reduce sum)
//   3. target_logit (N) = logit[target] if target is in this shard, else 0 (then all-reduce sum)
//   loss_n = log(row_sumexp) + row_max - target_logit
// Steps 1 and 2 may also run on the shard alone, with its own max (one read of the logits, as the
// GPU does); ce_rescale_sumexp then brings each shard's sum to the group's max before the sum:
//   row_sumexp (N) *= exp(local_max - row_max)
// ce_backward: dlogits (N, ld) = scale * (softmax - onehot(target)), 0 on padding columns
// (assigned, not accumulated: logits gradients have one producer).
// weights (N), optional (null: every row weighs 1): the loss mask. Row n's loss is
// w_n * loss_n and its dlogits row w_n * scale * (softmax - onehot); a row with w_n == 0 gets
// exactly 0 in both, whatever its logits (an ignored position is ignored, NaN and inf included,
// as PyTorch's ignore_index). A null `weights` runs the unweighted arithmetic unchanged.
template <class T>
void ce_row_max(T* row_max, const T* logits, int N, int ld, int valid);
template <class T>
void ce_row_sumexp(T* row_sumexp, const T* logits, const T* row_max, int N, int ld, int valid);
template <class T>
void ce_rescale_sumexp(T* row_sumexp, const T* local_max, const T* row_max, int N);
template <class T>
void ce_target_logit(T* target_logit, const T* logits, const int32_t* targets, int N, int ld,
                     int vocab_start, int valid);
template <class T>
void ce_losses(T* losses, const T* row_max, const T* row_sumexp, const T* target_logit,
               const T* weights, int N);
template <class T>
void ce_backward(T* dlogits, const T* logits, const T* row_max, const T* row_sumexp,
                 const int32_t* targets, const T* weights, T scale, int N, int ld, int vocab_start,
                 int valid);

}  // namespace strata::kernels::cpu

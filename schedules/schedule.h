// schedule.h — pipeline schedules as data.
//
// A schedule is a pure function of (kind, stage, p stages, m micro-batches, v model chunks per
// stage) returning the ordered instructions that one stage executes for one training batch
// (2bw: for a run of several batches, since it never flushes). Nothing here touches a tensor:
// the lists can be printed, checked and simulated (simulator.h) before anything runs, and the
// executor (runtime/) runs them as they are.
//
// Model chunks: with v chunks per stage the model is cut into p·v pieces; stage s holds chunks
// c = 0..v-1, which are model pieces c·p + s (Megatron's interleaving). For v = 1 chunk 0 is the
// stage's only piece. A forward of (mb, c) on stage s sends its output to the next piece:
// (s+1, c) when s < p-1, else (0, c+1); a backward sends its input gradient to the previous piece.
//
// Communication instructions name the micro-batch and the chunk of the data they carry, on
// this stage's side: kSendActivation(mb, c) sends the output of forward(mb, c);
// kRecvActivation(mb, c) receives the input of forward(mb, c); kSendGrad(mb, c) sends the input
// gradient produced by backward(mb, c); kRecvGrad(mb, c) receives the output gradient that
// backward(mb, c) needs. Sends never block (they are buffered by the transport); receives block
// until the matching send has happened. Sends and receives that a stage may post together (to
// avoid the send/recv ordering deadlocks of 1F1B) are adjacent in the list and carry the same
// `group` number (Megatron's batched send_forward_recv_backward); the executor posts a group as
// one batch.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

namespace strata {

enum class ScheduleKind { kGPipe, kOneFOneB, kInterleaved, kTwoBW, kZeroBubbleH1 };

// "gpipe", "1f1b", "interleaved", "2bw", "zb-h1" ↔ kind. parse returns false on an unknown name.
const char* to_string(ScheduleKind k);
bool parse_schedule_kind(const std::string& name, ScheduleKind* out);

// Whether the schedule drains the pipeline at the end of every batch, so that each batch is an
// instruction list of its own and one weight version is alive between batches. Every kind does
// but 2bw: batch j runs on W(j−1) while W(j+1) is computed, so two versions are alive at any
// moment and one list spans as many batches as the run lets it (docs/schedules.md).
bool flushes_every_batch(ScheduleKind k);

enum class Op {
  kRecvActivation,  // receive the input of forward(mb, chunk)
  kForward,         // forward(mb, chunk)
  kSendActivation,  // send the output of forward(mb, chunk)
  kRecvGrad,        // receive the output gradient of backward(mb, chunk)
  kBackward,        // full backward(mb, chunk): input and weight gradients
  kBackwardInput,   // zero-bubble: input gradient only (B)
  kBackwardWeight,  // zero-bubble: weight gradient only (W)
  kSendGrad,        // send the input gradient of backward(mb, chunk)
  kReduceGrads,     // the batch's gradients are final on this stage: reduce (data parallel),
                    // sum tied embeddings, clip
  kOptimizerStep,   // apply the update
  kSwitchWeights,   // 2bw: follows batch j's step; the version it made, W(j+1), is the one
                    // of batch j+2 onwards (batch j+1 keeps W(j)); docs/schedules.md
};
const char* to_string(Op op);

struct Instr {
  Op op = Op::kForward;
  int mb = -1;     // micro-batch (for 2bw: numbered across batches, batch = mb / m); -1 none
  int chunk = 0;   // model chunk on this stage (0..v-1)
  int group = -1;  // send/recv batching group (see above); -1 alone
};

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int stages = 1;        // p
  int microbatches = 1;  // m per batch
  int chunks = 1;        // v per stage (interleaved only; 1 otherwise)
  int batches = 1;       // 2bw: how many batches the list covers (others: 1)
};

// Why a spec cannot be scheduled ("interleaved needs microbatches >= stages, ..."), or "" when
// it can. Interleaved runs any m >= p (docs/schedules.md: micro-batch groups).
std::string schedule_invalid_reason(const ScheduleSpec& s);

// The instructions of `stage` (0..p-1). Precondition: schedule_invalid_reason(s) is "".
std::vector<Instr> build_schedule(const ScheduleSpec& s, int stage);

// Forward-only instructions for evaluation: every micro-batch of one batch through `stage`'s
// v chunks in model order, p stages, m micro-batches. Sends never block, so no stage waits on a
// later one.
std::vector<Instr> build_forward_only(int stage, int p, int v, int m);
// All stages' lists.
std::vector<std::vector<Instr>> build_all(const ScheduleSpec& s);

// Where the output of forward(mb, chunk) on `stage` goes (and where its input gradient comes
// from): the next model piece's (stage, chunk), or stage -1 past the last piece.
struct PieceRef {
  int stage = -1;
  int chunk = 0;
};
PieceRef next_piece(int stage, int chunk, int p, int v);
PieceRef prev_piece(int stage, int chunk, int p, int v);

// "F3.1" style short text of one instruction (for diagrams and the watchdog's schedule step):
// F, B (backward or backward-input), W, RA/SA (receive/send activation), RG/SG (receive/send
// gradient) + mb.chunk; "Reduce", "Step", "Switch".
std::string instr_string(const Instr& i);

}  // namespace strata

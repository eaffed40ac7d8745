// The pipeline executor's posting (runtime/engine/pipeline.h) on a recording communicator, one
// process: which transfers it posts together, in what order, with which tags and peers, and which
// schedule step it names as the wait context while it posts (what the NCCL watchdog prints for
// a hang). The transfers themselves and the multi-rank runs are tests/mpi_test_pipeline.cc's
// and scripts/gpu_check's e2e_mp; here every request completes at once and the stage's compute
// only hands out tensors.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "runtime/backend/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/watchdog.h"
#include "runtime/engine/pipeline.h"
#include "schedules/schedule.h"

namespace strata {
namespace {

// One posting: the ops in order, and the wait context at that moment.
struct Posting {
  std::vector<P2POp> ops;
  std::string context;
};

// A pipeline group of `size` in which every operation completes at once and every send and
// receive is recorded. rendezvous says what rendezvous_sends() answers (NCCL: true).
class RecordingComm : public Communicator {
 public:
  RecordingComm(int rank, int size, bool rendezvous)
      : rank_(rank), size_(size), rendezvous_(rendezvous) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CommBackend backend() const override { return CommBackend::kLocal; }
  Device device() const override { return Device::kCPU; }
  const std::string& name() const override { return name_; }
  int world_rank_of(int group_rank) const override { return group_rank; }
  double timeout_s() const override { return 0; }
  Request iall_reduce(void*, size_t, DType, ReduceOp) override { return unused(); }
  Request ireduce_scatter(const void*, void*, size_t, DType, ReduceOp) override { return unused(); }
  Request ireduce_scatterv(const void*, void*, const std::vector<size_t>&, DType,
                           ReduceOp) override {
    return unused();
  }
  Request iall_gather(const void*, void*, size_t, DType) override { return unused(); }
  Request iall_gatherv(const void*, void*, const std::vector<size_t>&, DType) override {
    return unused();
  }
  Request iall_to_allv(const void*, const std::vector<size_t>&, void*, const std::vector<size_t>&,
                       DType) override {
    return unused();
  }
  Request ibroadcast(void*, size_t, DType, int) override { return unused(); }
  Request isend(const void* buf, size_t count, DType dtype, int peer, int tag) override {
    return ibatch({P2POp::send(buf, count, dtype, peer, tag)});
  }
  Request irecv(void* buf, size_t count, DType dtype, int peer, int tag) override {
    return ibatch({P2POp::recv(buf, count, dtype, peer, tag)});
  }
  Request ibatch(const std::vector<P2POp>& ops) override {
    postings.push_back({ops, wait_context()});
    return Request();
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int, const std::string&) override { return nullptr; }
  bool rendezvous_sends() const override { return rendezvous_; }

  std::vector<Posting> postings;

 private:
  Request unused() {
    ADD_FAILURE() << "the executor called a collective";
    return Request();
  }
  int rank_, size_;
  bool rendezvous_;
  std::string name_ = "pp";
};

// Compute that only produces tensors of the boundary's shape: an output where a next piece
// exists, an input gradient where a previous one does.
class NullStage : public PipelineStage {
 public:
  NullStage(Backend& be, int stage, int p, int v) : be_(be), stage_(stage), p_(p), v_(v) {}
  Shape boundary_shape() const override { return {2, 3}; }
  Tensor forward(int, int chunk, const Tensor&) override {
    return next_piece(stage_, chunk, p_, v_).stage >= 0 ? tensor() : Tensor();
  }
  Tensor backward(int, int chunk, const Tensor&) override {
    return prev_piece(stage_, chunk, p_, v_).stage >= 0 ? tensor() : Tensor();
  }
  Tensor backward_input(int mb, int chunk, const Tensor& g) override {
    return backward(mb, chunk, g);
  }
  void backward_weight(int, int) override {}
  void reduce_grads() override {}
  void optimizer_step() override {}
  void switch_weights() override {}

 private:
  Tensor tensor() { return be_.empty(boundary_shape(), MemCategory::kActivations); }
  Backend& be_;
  int stage_, p_, v_;
};

// "S1 R0" for a send to 1 and a receive from 0.
std::string ops_string(const std::vector<P2POp>& ops) {
  std::string s;
  for (const P2POp& op : ops) {
    if (!s.empty()) s += " ";
    s += (op.kind == P2POp::Kind::kSend ? "S" : "R") + std::to_string(op.peer);
  }
  return s;
}

std::vector<Posting> run_stage(const ScheduleSpec& spec, int stage, bool rendezvous) {
  auto be = make_backend("cpu", 1);
  RecordingComm comm(stage, spec.stages, rendezvous);
  NullStage compute(*be, stage, spec.stages, spec.chunks);
  PipelineExecutor exec(comm, *be, stage, spec.stages, spec.chunks);
  exec.run(build_schedule(spec, stage), compute);
  return comm.postings;
}

ScheduleSpec one_f_one_b(int p, int m) {
  ScheduleSpec s;
  s.kind = ScheduleKind::kOneFOneB;
  s.stages = p;
  s.microbatches = m;
  return s;
}

TEST(PipelineExecutor, RendezvousSendsGoOutWithTheirGroupsReceives) {
  // Stage 0 of 1f1b, p = 2, m = 3: F0 SA0 F1 [SA1 RG0] B0 F2 [SA2 RG1] B1 RG2 B2. On NCCL each
  // group is one batch, its send first; a send outside a group is a batch of its own.
  const std::vector<Posting> nccl = run_stage(one_f_one_b(2, 3), 0, true);
  std::vector<std::string> got;
  for (const Posting& p : nccl) got.push_back(ops_string(p.ops));
  EXPECT_EQ(got, (std::vector<std::string>{"S1", "S1 R1", "S1 R1", "R1"}));
  // Every posting carries the schedule step it belongs to, sends-only batches included: that
  // is what the NCCL watchdog names for a send whose receive never comes.
  ASSERT_EQ(nccl.size(), 4u);
  EXPECT_EQ(nccl[0].context, "stage 0: SA0.0");
  EXPECT_EQ(nccl[1].context, "stage 0: SA1.0 + RG0.0");
  EXPECT_EQ(nccl[3].context, "stage 0: RG2.0");
  EXPECT_EQ(wait_context(), "");  // and none is left behind
}

TEST(PipelineExecutor, BufferedSendsArePostedAloneAndGroupsReceivesTogether) {
  // MPI: sends never hold anything up, so each goes out at once on its own; a group's
  // receives are still one batch.
  const std::vector<Posting> mpi = run_stage(one_f_one_b(2, 3), 0, false);
  std::vector<std::string> got;
  for (const Posting& p : mpi) got.push_back(ops_string(p.ops));
  EXPECT_EQ(got, (std::vector<std::string>{"S1", "S1", "R1", "S1", "R1", "R1"}));
}

TEST(PipelineExecutor, InterleavedPostsOneBatchPerRoundWithTheWrappedPeer) {
  // Interleaved, p = 2, m = 2, v = 2, stage 1 (schedule.cc's rounds): after each round one
  // batch with the round's sends and the next round's receives. Its chunk 0 sends the
  // activation on to stage 0's chunk 1 (the ring's wrap), so every transfer here is with rank 0;
  // tags tell the micro-batch, the receiving chunk and the direction apart.
  ScheduleSpec s;
  s.kind = ScheduleKind::kInterleaved;
  s.stages = 2;
  s.microbatches = 2;
  s.chunks = 2;
  const std::vector<Posting> nccl = run_stage(s, 1, true);
  std::vector<std::string> contexts;
  for (const Posting& p : nccl) contexts.push_back(p.context);
  EXPECT_EQ(contexts, (std::vector<std::string>{"stage 1: RA0.0", "stage 1: SA0.0 + RA1.0",
                                                "stage 1: SA1.0 + RA0.1", "stage 1: SG0.1 + RA1.1",
                                                "stage 1: SG1.1 + RG0.0", "stage 1: SG0.0 + RG1.0",
                                                "stage 1: SG1.0"}));
  for (const Posting& p : nccl)
    for (const P2POp& op : p.ops) EXPECT_EQ(op.peer, 0) << p.context;
  // SA0.0 of stage 1 goes to chunk 1 of stage 0: tag (mb 0, chunk 1, activation) = 2.
  ASSERT_EQ(nccl[1].ops.size(), 2u);
  EXPECT_EQ(nccl[1].ops[0].kind, P2POp::Kind::kSend);
  EXPECT_EQ(nccl[1].ops[0].tag, 2);
}

}  // namespace
}  // namespace strata

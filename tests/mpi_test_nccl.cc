// The NCCL backend under mpirun, one CUDA device per rank: the same checks as mpi_test_comm
// (inputs from (seed, rank), expected values computed locally, mismatches summed over the world
// on a host communicator), on device buffers. Skips visibly where there is no CUDA device or
// fewer devices than ranks on a host.
//
// All data moves on a non-default compute stream with no host synchronisation between upload,
// collective and download: a result that is right proves the event ordering of the contract in
// cuda/comm_nccl.cc, not just the collective.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <numeric>
#include <vector>

#include "runtime/comm/comm.h"
#include "tests/mpi_test_util.h"

namespace strata {
namespace {

using mpitest::Buf;
using mpitest::input;
using mpitest::label;
using mpitest::reduced;
using mpitest::Tally;
using mpitest::value;

constexpr double kTimeoutS = 60;
constexpr uint64_t kSeed = 777;

#define TEST_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Why this host cannot run the NCCL checks ("" when it can); the same on every rank of a host.
std::string skip_reason() {
  const int devices = cuda_device_count();
  if (devices == 0) return "no CUDA device";
  if (world().local_size > devices) {
    return std::to_string(world().local_size) + " ranks share " + std::to_string(devices) +
           " CUDA devices; NCCL needs one per rank";
  }
  return "";
}

class Nccl : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!skip_reason().empty()) return;
    comm_ = make_world_communicator(CommBackend::kNCCL, kTimeoutS).release();
    cudaSetDevice(local_device_index());
    cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking);
    comm_->set_compute_stream(compute_);
  }
  static void TearDownTestSuite() {
    delete comm_;
    comm_ = nullptr;
    if (compute_ != nullptr) cudaStreamDestroy(compute_);
    compute_ = nullptr;
  }
  void SetUp() override {
    const std::string why = skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
  }

  // A device copy of a host buffer, uploaded on the compute stream.
  struct DevBuf {
    void* p = nullptr;
    size_t bytes = 0;
    DevBuf(const Buf& host, cudaStream_t s) : bytes(host.size_bytes()) {
      cudaMalloc(&p, bytes + 1);
      cudaMemcpyAsync(p, host.bytes.data(), bytes, cudaMemcpyHostToDevice, s);
    }
    ~DevBuf() { cudaFree(p); }
    void download(Buf& host, cudaStream_t s) const {
      cudaMemcpyAsync(host.bytes.data(), p, bytes, cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);
    }
  };

  static Communicator* comm_;
  static cudaStream_t compute_;
};
Communicator* Nccl::comm_ = nullptr;
cudaStream_t Nccl::compute_ = nullptr;

const DType kTypes[] = {DType::kF32, DType::kI32, DType::kBF16};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMax};

TEST_F(Nccl, AllReduce) {
  Tally tally;
  const int me = comm_->rank(), p = comm_->size();
  uint64_t seed = kSeed;
  for (DType t : kTypes) {
    for (ReduceOp op : kOps) {
      for (size_t n :
           {size_t{0}, size_t{1}, size_t{7}, size_t{1025}, size_t{3} * p + 1, size_t{1} << 20}) {
        ++seed;
        Buf h = input(t, n, seed, me);
        DevBuf d(h, compute_);
        comm_->all_reduce(d.p, n, t, op);
        d.download(h, compute_);
        int64_t bad = 0;
        for (size_t i = 0; i < n; ++i) bad += h.get(i) != reduced(seed, i, op, p);
        tally.add(label("all_reduce", t, n, to_string(op)), bad);
      }
    }
  }
  tally.expect_clean("nccl all_reduce");
}

TEST_F(Nccl, ReduceScatterEvenAndUneven) {
  Tally tally;
  const int me = comm_->rank(), p = comm_->size();
  uint64_t seed = kSeed + 1000;
  for (DType t : kTypes) {
    for (size_t total : {size_t{0}, size_t{7}, size_t{1025}, size_t{4} * p}) {
      ++seed;
      const std::vector<size_t> counts = chunk_counts(total, p);
      const size_t offset = std::accumulate(counts.begin(), counts.begin() + me, size_t{0});
      Buf send = input(t, total, seed, me), recv(t, counts[me]);
      DevBuf ds(send, compute_), dr(recv, compute_);
      comm_->reduce_scatterv(ds.p, dr.p, counts, t, ReduceOp::kSum);
      dr.download(recv, compute_);
      int64_t bad = 0;
      for (size_t i = 0; i < counts[me]; ++i) {
        bad += recv.get(i) != reduced(seed, offset + i, ReduceOp::kSum, p);
      }
      tally.add(label("reduce_scatterv", t, total), bad);
      if (total % p == 0) {
        Buf r2(t, total / p);
        DevBuf d2(r2, compute_);
        comm_->reduce_scatter(ds.p, d2.p, total / p, t, ReduceOp::kSum);
        d2.download(r2, compute_);
        bad = 0;
        for (size_t i = 0; i < total / p; ++i) {
          bad += r2.get(i) != reduced(seed, me * (total / p) + i, ReduceOp::kSum, p);
        }
        tally.add(label("reduce_scatter", t, total), bad);
      }
    }
  }
  tally.expect_clean("nccl reduce_scatter");
}

TEST_F(Nccl, AllGatherEvenAndUneven) {
  Tally tally;
  const int me = comm_->rank(), p = comm_->size();
  uint64_t seed = kSeed + 2000;
  for (DType t : kTypes) {
    for (size_t total : {size_t{0}, size_t{7}, size_t{1025}, size_t{4} * p}) {
      ++seed;
      const std::vector<size_t> counts = chunk_counts(total, p);
      std::vector<size_t> offsets(p, 0);
      for (int r = 1; r < p; ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
      Buf send = input(t, counts[me], seed, me, offsets[me]), recv(t, total);
      DevBuf ds(send, compute_), dr(recv, compute_);
      comm_->all_gatherv(ds.p, dr.p, counts, t);
      dr.download(recv, compute_);
      int64_t bad = 0;
      for (int r = 0; r < p; ++r) {
        for (size_t i = 0; i < counts[r]; ++i) {
          bad += recv.get(offsets[r] + i) != value(seed, r, offsets[r] + i);
        }
      }
      tally.add(label("all_gatherv", t, total), bad);
      if (total % p == 0) {
        comm_->all_gather(ds.p, dr.p, total / p, t);
        dr.download(recv, compute_);
        bad = 0;
        for (size_t i = 0; i < total; ++i)
          bad += recv.get(i) != value(seed, static_cast<int>(i / (total / p)), i);
        tally.add(label("all_gather", t, total), bad);
      }
    }
  }
  tally.expect_clean("nccl all_gather");
}

// The uneven all-to-all (a mixture of experts' dispatch; NCCL: one group of a send and a receive
// per peer, self included): rank r sends (r + 2·q) % 5 · 3 elements to rank q, zero among them.
TEST_F(Nccl, AllToAllUneven) {
  Tally tally;
  const int me = comm_->rank(), p = comm_->size();
  const auto count = [](int from, int to) { return static_cast<size_t>((from + 2 * to) % 5) * 3; };
  uint64_t seed = kSeed + 2500;
  for (DType t : kTypes) {
    ++seed;
    std::vector<size_t> sc(p), rc(p);
    size_t sent = 0, received = 0;
    for (int q = 0; q < p; ++q) {
      sc[q] = count(me, q);
      rc[q] = count(q, me);
      sent += sc[q];
      received += rc[q];
    }
    Buf send(t, sent), recv(t, received);
    size_t at = 0;
    for (int q = 0; q < p; ++q)
      for (size_t j = 0; j < sc[q]; ++j) send.set(at++, value(seed, me, 1000 * q + j));
    DevBuf ds(send, compute_), dr(recv, compute_);
    comm_->all_to_allv(ds.p, sc, dr.p, rc, t);
    dr.download(recv, compute_);
    int64_t bad = 0;
    at = 0;
    for (int q = 0; q < p; ++q)
      for (size_t j = 0; j < rc[q]; ++j)
        bad += recv.get(at++) != value(seed, q, 1000 * static_cast<size_t>(me) + j);
    tally.add(label("all_to_allv", t, received), bad);
  }
  tally.expect_clean("nccl all_to_allv");
}

TEST_F(Nccl, BroadcastAndBatchedSendRecv) {
  Tally tally;
  const int me = comm_->rank(), p = comm_->size();
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  uint64_t seed = kSeed + 3000;
  for (DType t : kTypes) {
    for (size_t n : {size_t{0}, size_t{7}, size_t{1025}, size_t{1} << 20}) {
      seed += 3;
      for (int root = 0; root < p; ++root) {
        Buf b = input(t, n, seed, me);
        DevBuf d(b, compute_);
        comm_->broadcast(d.p, n, t, root);
        d.download(b, compute_);
        int64_t bad = 0;
        for (size_t i = 0; i < n; ++i) bad += b.get(i) != value(seed, root, i);
        tally.add(label("broadcast", t, n), bad);
      }
      Buf fo = input(t, n, seed + 1, me), bo = input(t, n, seed + 2, me), fi(t, n), bi(t, n);
      DevBuf dfo(fo, compute_), dbo(bo, compute_), dfi(fi, compute_), dbi(bi, compute_);
      comm_->batch({P2POp::send(dfo.p, n, t, next), P2POp::send(dbo.p, n, t, prev),
                    P2POp::recv(dfi.p, n, t, prev), P2POp::recv(dbi.p, n, t, next)});
      dfi.download(fi, compute_);
      dbi.download(bi, compute_);
      int64_t bad = 0;
      // With 2 ranks next == prev: NCCL matches the two messages per peer in posting order.
      for (size_t i = 0; i < n; ++i) {
        bad += fi.get(i) != value(seed + 1, prev, i);
        bad += bi.get(i) != value(seed + 2, next, i);
      }
      tally.add(label("batch", t, n), bad);
    }
  }
  comm_->barrier();
  tally.expect_clean("nccl broadcast/batch");
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  const strata::World w = strata::init_world(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  strata::mpitest::print_on_rank0_only(w.rank);
  int rc = 0;
  {
    auto verdict = strata::make_world_communicator(strata::CommBackend::kMPI, strata::kTimeoutS);
    strata::mpitest::verdict_comm() = verdict.get();
    rc = RUN_ALL_TESTS();
  }
  strata::finalize_world();
  return rc;
}

// Communicator under mpirun (1, 2, 3, 4 and 8 ranks), in the manner of nccl-tests: every rank
// fills its input from (seed, rank), computes the expected output of the whole group locally from
// the same formula, counts its mismatches, and the counts are summed over the world so that every
// rank reaches the same verdict (and the same gtest control flow). Results print on rank 0 only.
//
// Inputs are small integers (|v| <= 16), so sums over up to 8 ranks are exact in f32, i32 and
// bf16 (bf16 holds integers up to 256 exactly) whatever order a backend reduces in: expected
// values are compared for equality.
//
// Sizes: 0, 1, 7, 1000, 1025 and sizes that do not divide by the rank count, plus one large
// message (MPI switches to its rendezvous protocol and segmented algorithms there).
//
// Also runnable without mpirun (world size 1, Local backend). With --staged, every test runs on a
// staged communicator (make_staged_communicator: the path of ranks that share one GPU) over the
// same MPI world, with host memory playing the device; StagedCarriesOnlyStagedBytes then checks
// that the transport sees only what the staging copied.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/comm/comm.h"
#include "runtime/comm/process_groups.h"
#include "tests/mpi_test_util.h"

namespace strata {
namespace {

constexpr double kTimeoutS = 60;
constexpr uint64_t kSeed = 20240611;

Communicator* g_comm = nullptr;  // under test: the world on the MPI backend (Local for 1 rank)

// Host memory as the "device" of a staged communicator. Copies are plain, or with `xor_mask`
// every byte is XORed on its way in and out: device memory then holds an encoding that only the
// staging undoes, so a device address reaching the transport directly would give wrong results.
class TestStaging final : public DeviceStaging {
 public:
  unsigned char xor_mask = 0;
  size_t to_host_bytes = 0, to_device_bytes = 0;

  Device device() const override { return Device::kCPU; }
  void to_host(void* host, const void* device, size_t bytes) override {
    copy(host, device, bytes);
    to_host_bytes += bytes;
  }
  void to_device(void* device, const void* host, size_t bytes) override {
    copy(device, host, bytes);
    to_device_bytes += bytes;
  }
  // The device encoding of host bytes, and back (XOR is its own inverse).
  void encode(void* p, size_t bytes) const {
    auto* b = static_cast<unsigned char*>(p);
    for (size_t i = 0; i < bytes; ++i) b[i] ^= xor_mask;
  }

 private:
  void copy(void* dst, const void* src, size_t bytes) const {
    std::memcpy(dst, src, bytes);
    encode(dst, bytes);
  }
};
std::shared_ptr<TestStaging> g_staging;  // set with --staged

using mpitest::Buf;
using mpitest::input;
using mpitest::label;
using mpitest::reduced;
using mpitest::Tally;
using mpitest::value;

const DType kTypes[] = {DType::kF32, DType::kI32, DType::kBF16};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMax};

// Odd sizes, and sizes that never divide by the rank count when it is > 1.
std::vector<size_t> sizes() {
  const size_t p = static_cast<size_t>(g_comm->size());
  return {0, 1, 7, 1000, 1025, 3 * p + 1, 65537};
}

TEST(Comm, AllReduce) {
  Tally tally;
  const int me = g_comm->rank(), n_ranks = g_comm->size();
  uint64_t seed = kSeed;
  for (DType t : kTypes) {
    for (ReduceOp op : kOps) {
      for (size_t n : sizes()) {
        ++seed;
        Buf b = input(t, n, seed, me);
        g_comm->all_reduce(b.data(), n, t, op);
        int64_t bad = 0;
        for (size_t i = 0; i < n; ++i) bad += b.get(i) != reduced(seed, i, op, n_ranks);
        tally.add(label("all_reduce", t, n, to_string(op)), bad);
      }
    }
  }
  // One large message: 4 MiB of f32.
  const size_t big = size_t{1} << 20;
  Buf b = input(DType::kF32, big, seed + 1, me);
  g_comm->all_reduce(b.data(), big, DType::kF32, ReduceOp::kSum);
  int64_t bad = 0;
  for (size_t i = 0; i < big; ++i) bad += b.get(i) != reduced(seed + 1, i, ReduceOp::kSum, n_ranks);
  tally.add(label("all_reduce", DType::kF32, big, "sum"), bad);
  tally.expect_clean("all_reduce");
}

// Several non-blocking all_reduces in flight at once (gradient buckets), waited out of order.
TEST(Comm, NonBlockingAllReduceInFlightTogether) {
  Tally tally;
  const int me = g_comm->rank(), n_ranks = g_comm->size();
  const std::vector<size_t> ns = {1025, 0, 70001, 7, 50000};  // two above the ring threshold
  std::vector<Buf> bufs;
  std::vector<Request> reqs;
  for (size_t k = 0; k < ns.size(); ++k)
    bufs.push_back(input(DType::kF32, ns[k], kSeed + 100 + k, me));
  for (size_t k = 0; k < ns.size(); ++k) {
    reqs.push_back(g_comm->iall_reduce(bufs[k].data(), ns[k], DType::kF32, ReduceOp::kSum));
  }
  reqs[1].test();  // polling one request must not disturb the others
  for (size_t k = ns.size(); k-- > 0;) reqs[k].wait();
  for (size_t k = 0; k < ns.size(); ++k) {
    int64_t bad = 0;
    for (size_t i = 0; i < ns[k]; ++i) {
      bad += bufs[k].get(i) != reduced(kSeed + 100 + k, i, ReduceOp::kSum, n_ranks);
    }
    tally.add(label("iall_reduce", DType::kF32, ns[k], "sum"), bad);
  }
  tally.expect_clean("iall_reduce");
}

TEST(Comm, ReduceScatter) {
  Tally tally;
  const int me = g_comm->rank(), p = g_comm->size();
  uint64_t seed = kSeed + 1000;
  for (DType t : kTypes) {
    for (ReduceOp op : kOps) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{1025}}) {
        ++seed;
        Buf send = input(t, n * p, seed, me);
        Buf recv(t, n);
        g_comm->reduce_scatter(send.data(), recv.data(), n, t, op);
        int64_t bad = 0;
        for (size_t i = 0; i < n; ++i) bad += recv.get(i) != reduced(seed, me * n + i, op, p);
        tally.add(label("reduce_scatter", t, n, to_string(op)), bad);
      }
    }
  }
  tally.expect_clean("reduce_scatter");
}

// Totals that do not divide by the rank count, split as chunk_counts() does.
TEST(Comm, ReduceScatterUneven) {
  Tally tally;
  const int me = g_comm->rank(), p = g_comm->size();
  uint64_t seed = kSeed + 2000;
  for (DType t : kTypes) {
    for (ReduceOp op : kOps) {
      for (size_t total : sizes()) {
        ++seed;
        const std::vector<size_t> counts = chunk_counts(total, p);
        const size_t offset = std::accumulate(counts.begin(), counts.begin() + me, size_t{0});
        Buf send = input(t, total, seed, me);
        Buf recv(t, counts[me]);
        g_comm->reduce_scatterv(send.data(), recv.data(), counts, t, op);
        int64_t bad = 0;
        for (size_t i = 0; i < counts[me]; ++i)
          bad += recv.get(i) != reduced(seed, offset + i, op, p);
        tally.add(label("reduce_scatterv", t, total, to_string(op)), bad);
      }
    }
  }
  tally.expect_clean("reduce_scatterv");
}

TEST(Comm, AllGather) {
  Tally tally;
  const int me = g_comm->rank(), p = g_comm->size();
  uint64_t seed = kSeed + 3000;
  for (DType t : kTypes) {
    for (bool in_place : {false, true}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{1025}}) {
        ++seed;
        Buf send = input(t, n, seed, me);
        Buf recv(t, n * p);
        const void* src = send.data();
        if (in_place) {
          std::memcpy(recv.bytes.data() + me * n * dtype_size(t), send.data(), n * dtype_size(t));
          src = recv.bytes.data() + me * n * dtype_size(t);
        }
        g_comm->all_gather(src, recv.data(), n, t);
        int64_t bad = 0;
        for (int r = 0; r < p; ++r) {
          for (size_t i = 0; i < n; ++i) bad += recv.get(r * n + i) != value(seed, r, i);
        }
        tally.add(label(in_place ? "all_gather in-place" : "all_gather", t, n), bad);
      }
    }
  }
  tally.expect_clean("all_gather");
}

TEST(Comm, AllGatherUneven) {
  Tally tally;
  const int me = g_comm->rank(), p = g_comm->size();
  uint64_t seed = kSeed + 4000;
  for (DType t : kTypes) {
    for (bool in_place : {false, true}) {
      for (size_t total : sizes()) {
        ++seed;
        const std::vector<size_t> counts = chunk_counts(total, p);
        std::vector<size_t> offsets(p, 0);
        for (int r = 1; r < p; ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
        // Rank r contributes elements [offsets[r], offsets[r] + counts[r]) of its own input.
        Buf send = input(t, counts[me], seed, me, offsets[me]);
        Buf recv(t, total);
        const void* src = send.data();
        if (in_place) {
          char* slot = recv.bytes.data() + offsets[me] * dtype_size(t);
          std::memcpy(slot, send.data(), counts[me] * dtype_size(t));
          src = slot;
        }
        g_comm->all_gatherv(src, recv.data(), counts, t);
        int64_t bad = 0;
        for (int r = 0; r < p; ++r) {
          for (size_t i = 0; i < counts[r]; ++i) {
            bad += recv.get(offsets[r] + i) != value(seed, r, offsets[r] + i);
          }
        }
        tally.add(label(in_place ? "all_gatherv in-place" : "all_gatherv", t, total), bad);
      }
    }
  }
  tally.expect_clean("all_gatherv");
}

// Uneven all-to-all (the mixture of experts' dispatch): rank r sends (r + 2·q + i) % 5 elements
// to rank q (zero counts among them), each element naming its source, destination and place;
// every receive lands in source order.
TEST(Comm, AllToAllUneven) {
  Tally tally;
  const int me = g_comm->rank(), p = g_comm->size();
  const auto count = [](int from, int to, int i) {
    return static_cast<size_t>((from + 2 * to + i) % 5) * static_cast<size_t>(i + 1);
  };
  uint64_t seed = kSeed + 4500;
  for (DType t : kTypes) {
    for (int i = 0; i < 3; ++i) {
      ++seed;
      std::vector<size_t> sc(p), rc(p);
      for (int q = 0; q < p; ++q) {
        sc[q] = count(me, q, i);
        rc[q] = count(q, me, i);
      }
      // The element for rank q at place j is value(seed, me, q·1000 + j).
      size_t sent = 0, received = 0;
      for (int q = 0; q < p; ++q) {
        sent += sc[q];
        received += rc[q];
      }
      Buf send(t, sent), recv(t, received);
      size_t at = 0;
      for (int q = 0; q < p; ++q)
        for (size_t j = 0; j < sc[q]; ++j) send.set(at++, value(seed, me, 1000 * q + j));
      g_comm->all_to_allv(send.data(), sc, recv.data(), rc, t);
      int64_t bad = 0;
      at = 0;
      for (int q = 0; q < p; ++q)
        for (size_t j = 0; j < rc[q]; ++j)
          bad += recv.get(at++) != value(seed, q, 1000 * static_cast<size_t>(me) + j);
      tally.add(label("all_to_allv", t, received), bad);
    }
  }
  tally.expect_clean("all_to_allv");
}

TEST(Comm, BroadcastFromEveryRoot) {
  Tally tally;
  const int me = g_comm->rank(), p = g_comm->size();
  uint64_t seed = kSeed + 5000;
  for (DType t : kTypes) {
    for (int root = 0; root < p; ++root) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1025}, size_t{65537}}) {
        ++seed;
        Buf b = input(t, n, seed, me);
        g_comm->broadcast(b.data(), n, t, root);
        int64_t bad = 0;
        for (size_t i = 0; i < n; ++i) bad += b.get(i) != value(seed, root, i);
        tally.add(label("broadcast", t, n, ("root " + std::to_string(root)).c_str()), bad);
      }
    }
  }
  tally.expect_clean("broadcast");
}

// Every rank sends to the next and receives from the previous one (separate isend / irecv).
TEST(Comm, SendRecvRing) {
  Tally tally;
  const int me = g_comm->rank(), p = g_comm->size();
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  uint64_t seed = kSeed + 6000;
  for (DType t : kTypes) {
    for (size_t n :
         {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{1025}, size_t{1} << 20}) {
      ++seed;
      Buf out = input(t, n, seed, me);
      Buf in(t, n);
      Request r = g_comm->irecv(in.data(), n, t, prev, 5);
      Request s = g_comm->isend(out.data(), n, t, next, 5);
      s.wait();
      r.wait();
      int64_t bad = 0;
      for (size_t i = 0; i < n; ++i) bad += in.get(i) != value(seed, prev, i);
      tally.add(label("send/recv ring", t, n), bad);
    }
  }
  tally.expect_clean("send/recv ring");
}

// 1F1B's steady state: send forward + receive backward + send backward + receive forward, all in
// one batch. Messages are large enough for MPI's rendezvous protocol, where sends posted before
// receives on every rank would deadlock; the batch must not.
TEST(Comm, BatchedBothDirections) {
  Tally tally;
  const int me = g_comm->rank(), p = g_comm->size();
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  uint64_t seed = kSeed + 7000;
  for (DType t : kTypes) {
    for (size_t n : {size_t{0}, size_t{7}, size_t{1025}, size_t{1} << 19}) {
      seed += 2;
      Buf fwd_out = input(t, n, seed, me), bwd_out = input(t, n, seed + 1, me);
      Buf fwd_in(t, n), bwd_in(t, n);
      g_comm->batch({P2POp::send(fwd_out.data(), n, t, next, /*tag=*/1),
                     P2POp::send(bwd_out.data(), n, t, prev, /*tag=*/2),
                     P2POp::recv(fwd_in.data(), n, t, prev, /*tag=*/1),
                     P2POp::recv(bwd_in.data(), n, t, next, /*tag=*/2)});
      int64_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        bad += fwd_in.get(i) != value(seed, prev, i);
        bad += bwd_in.get(i) != value(seed + 1, next, i);
      }
      tally.add(label("batch", t, n), bad);
    }
  }
  tally.expect_clean("batched send/recv");
}

TEST(Comm, BarrierAndRequestHandles) {
  Tally tally;
  for (int i = 0; i < 3; ++i) g_comm->barrier();
  // A Request destroyed or overwritten without wait() completes its operation first.
  const int me = g_comm->rank(), p = g_comm->size();
  int32_t a = me, b = me;
  { Request r = g_comm->iall_reduce(&a, 1, DType::kI32, ReduceOp::kSum); }
  Request r2 = g_comm->iall_reduce(&b, 1, DType::kI32, ReduceOp::kMax);
  Request moved = std::move(r2);
  moved.wait();
  moved.wait();  // idempotent
  tally.add("request destroyed unwaited", a != p * (p - 1) / 2);
  tally.add("request moved", b != p - 1);
  tally.expect_clean("barrier/requests");
}

// split(): color and key, and world_rank_of() on the result.
TEST(Comm, SplitOrdersByKey) {
  Tally tally;
  const int me = g_comm->rank(), p = g_comm->size();
  // Two groups: even and odd world ranks, each ordered by descending world rank.
  std::unique_ptr<Communicator> half = g_comm->split(me % 2, p - me, "parity");
  std::vector<int> members;
  for (int r = p - 1; r >= 0; --r) {
    if (r % 2 == me % 2) members.push_back(r);
  }
  tally.add("split size", half->size() != static_cast<int>(members.size()));
  int64_t bad = 0;
  for (int g = 0; g < half->size(); ++g) bad += half->world_rank_of(g) != members[g];
  tally.add("split order", bad);
  int32_t sum = me;
  half->all_reduce(&sum, 1, DType::kI32, ReduceOp::kSum);
  tally.add("split all_reduce", sum != std::accumulate(members.begin(), members.end(), 0));
  // A negative color leaves the rank out.
  std::unique_ptr<Communicator> none = g_comm->split(me == 0 ? 0 : -1, 0, "rank0");
  tally.add("split excluded", (none == nullptr) != (me != 0));
  tally.expect_clean("split");
}

// Every (t, p, d) with t·p·d = world size: each group reduces over exactly the members of
// group_layout(), pipeline neighbours exchange along pp, and the rank table lists every rank.
TEST(Comm, ProcessGroupsOfEveryFactorisation) {
  Tally tally;
  const int n = g_comm->size();
  for (int t = 1; t <= n; ++t) {
    for (int p = 1; p <= n; ++p) {
      if (n % (t * p) != 0) continue;
      const int d = n / (t * p);
      const std::string cfg =
          "t=" + std::to_string(t) + " p=" + std::to_string(p) + " d=" + std::to_string(d);
      // Expert groups of the largest divisor of d below it (2 when d = 4), or none.
      int ex = 1;
      for (int c = 2; c < d; ++c)
        if (d % c == 0) ex = c;
      ProcessGroups g = make_process_groups(t, p, d, CommBackend::kMPI, kTimeoutS, g_staging, ex);
      const int me = world().rank;
      const GroupLayout& L = g.layout;
      struct Kind {
        const char* name;
        Communicator* comm;
        const std::vector<int>* members;
      };
      const int e = L.embedding_group_of(me);
      std::vector<Kind> kinds = {{"tp", g.tp.get(), &L.tp_groups[L.tp_group_of(me)]},
                                 {"dp", g.dp.get(), &L.dp_groups[L.dp_group_of(me)]},
                                 {"pp", g.pp.get(), &L.pp_groups[L.pp_group_of(me)]},
                                 {"mp", g.mp.get(), &L.mp_groups[L.mp_group_of(me)]}};
      if (e >= 0) kinds.push_back({"embedding", g.embedding.get(), &L.embedding_groups[e]});
      if (ex > 1) {
        kinds.push_back({"ep", g.ep.get(), &L.ep_groups[L.ep_group_of(me)]});
        kinds.push_back({"edp", g.edp.get(), &L.edp_groups[L.edp_group_of(me)]});
        // An expert group is a run of consecutive data ranks; its expert-data group strides it.
        const RankCoord c = L.coord(me);
        tally.add(cfg + " ep rank", g.ep_rank != c.dp % ex || g.ep->rank() != c.dp % ex ||
                                        g.edp->rank() != c.dp / ex || g.edp_rank != c.dp / ex);
      }
      tally.add(cfg + " expert groups", (ex > 1) != (g.ep != nullptr));
      tally.add(cfg + " embedding membership", (g.embedding != nullptr) != (e >= 0));
      for (const Kind& k : kinds) {
        int64_t bad = k.comm->size() != static_cast<int>(k.members->size());
        for (int r = 0; r < k.comm->size() && !bad; ++r)
          bad += k.comm->world_rank_of(r) != (*k.members)[r];
        int32_t sum = me;
        k.comm->all_reduce(&sum, 1, DType::kI32, ReduceOp::kSum);
        bad += sum != std::accumulate(k.members->begin(), k.members->end(), 0);
        tally.add(cfg + " " + k.name, bad);
      }
      // Forward along the pipeline: each stage learns its predecessor's world rank.
      int32_t from_prev = -1;
      const int32_t mine = me;
      std::vector<P2POp> ops;
      if (g.next_stage_rank >= 0) ops.push_back(P2POp::send(&mine, 1, DType::kI32, g.pp_rank + 1));
      if (g.prev_stage_rank >= 0)
        ops.push_back(P2POp::recv(&from_prev, 1, DType::kI32, g.pp_rank - 1));
      g.pp->batch(ops);
      tally.add(cfg + " prev stage", g.prev_stage_rank >= 0 && from_prev != g.prev_stage_rank);
      const std::string table = rank_table(g, "cpu");
      if (me == 0) {
        const long lines = std::count(table.begin(), table.end(), '\n');
        tally.add(cfg + " rank table", lines != n + 2);
      }
    }
  }
  tally.expect_clean("process groups");
}

TEST(Comm, TensorForms) {
  Tally tally;
  const int me = g_comm->rank(), p = g_comm->size();
  Tensor x = Tensor::zeros({3, 5}, DType::kF32, MemCategory::kBuffers);
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = static_cast<float>(me + i);
  g_comm->all_reduce(x, ReduceOp::kMax);
  int64_t bad = 0;
  for (int64_t i = 0; i < x.numel(); ++i) bad += x.f32()[i] != static_cast<float>(p - 1 + i);
  tally.add("tensor all_reduce", bad);
  tally.expect_clean("tensor forms");
}

TEST(Comm, StringsGather) {
  Tally tally;
  const std::vector<std::string> all =
      all_gather_strings(*g_comm, std::string(g_comm->rank(), 'x'));
  int64_t bad = all.size() != static_cast<size_t>(g_comm->size());
  for (size_t r = 0; r < all.size(); ++r) bad += all[r] != std::string(r, 'x');
  tally.add("all_gather_strings", bad);
  tally.expect_clean("all_gather_strings");
}

// Staged only: with device memory XOR-encoded, every operation still gives the plain results
// once decoded, which only holds if the transport saw nothing but the staging's host copies.
TEST(Comm, StagedCarriesOnlyStagedBytes) {
  if (!g_staging) GTEST_SKIP() << "runs with --staged";
  Tally tally;
  const int me = g_comm->rank(), p = g_comm->size();
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  g_staging->xor_mask = 0x5a;
  auto dev = [](Buf b) {  // the device form of a host buffer
    g_staging->encode(b.data(), b.size_bytes());
    return b;
  };
  auto host = [](Buf& b) -> Buf& {
    g_staging->encode(b.data(), b.size_bytes());
    return b;
  };
  const size_t n = 1025;
  uint64_t seed = kSeed + 9000;
  for (DType t : kTypes) {
    ++seed;
    Buf a = dev(input(t, n, seed, me));
    g_comm->all_reduce(a.data(), n, t, ReduceOp::kSum);
    host(a);
    int64_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += a.get(i) != reduced(seed, i, ReduceOp::kSum, p);
    tally.add(label("staged all_reduce", t, n), bad);

    const std::vector<size_t> counts = chunk_counts(n, p);
    const size_t offset = std::accumulate(counts.begin(), counts.begin() + me, size_t{0});
    Buf send = dev(input(t, n, seed, me)), part(t, counts[me]);
    part = dev(part);
    g_comm->reduce_scatterv(send.data(), part.data(), counts, t, ReduceOp::kMax);
    host(part);
    bad = 0;
    for (size_t i = 0; i < counts[me]; ++i)
      bad += part.get(i) != reduced(seed, offset + i, ReduceOp::kMax, p);
    tally.add(label("staged reduce_scatterv", t, n), bad);

    Buf mine = dev(input(t, counts[me], seed, me, offset)), all(t, n);
    g_comm->all_gatherv(mine.data(), all.data(), counts, t);
    host(all);
    bad = 0;
    for (int r = 0, at = 0; r < p; at += static_cast<int>(counts[r]), ++r)
      for (size_t i = 0; i < counts[r]; ++i) bad += all.get(at + i) != value(seed, r, at + i);
    tally.add(label("staged all_gatherv", t, n), bad);

    Buf fwd = dev(input(t, n, seed + 1, me)), in(t, n);
    Request r = g_comm->irecv(in.data(), n, t, prev, 3);
    g_comm->isend(fwd.data(), n, t, next, 3).wait();
    r.wait();
    host(in);
    bad = 0;
    for (size_t i = 0; i < n; ++i) bad += in.get(i) != value(seed + 1, prev, i);
    tally.add(label("staged send/recv", t, n), bad);
  }
  g_staging->xor_mask = 0;
  tally.add("staging moved bytes",
            g_staging->to_host_bytes == 0 || g_staging->to_device_bytes == 0);
  tally.expect_clean("staged bytes only");
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  const strata::World w = strata::init_world(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  strata::mpitest::print_on_rank0_only(w.rank);
  bool staged = false;
  for (int i = 1; i < argc; ++i) staged |= std::string(argv[i]) == "--staged";
  int rc = 0;
  {
    auto comm = strata::make_world_communicator(strata::CommBackend::kMPI, strata::kTimeoutS);
    if (staged) {
      strata::g_staging = std::make_shared<strata::TestStaging>();
      comm = strata::make_staged_communicator(std::move(comm), strata::g_staging);
    }
    auto verdict = strata::make_world_communicator(strata::CommBackend::kMPI, strata::kTimeoutS);
    strata::g_comm = comm.get();
    strata::mpitest::verdict_comm() = verdict.get();
    if (w.rank == 0) {
      std::printf("world %d ranks, backend %s%s, seed %llu\n", w.size,
                  strata::to_string(comm->backend()), staged ? " (staged)" : "",
                  static_cast<unsigned long long>(strata::kSeed));
    }
    rc = RUN_ALL_TESTS();
  }
  strata::g_staging.reset();
  strata::finalize_world();
  return rc;
}

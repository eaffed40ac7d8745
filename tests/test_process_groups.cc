// Process-group layout (no MPI): for every factorisation of 8 ranks into t·p·d, every rank is in
// exactly one group of each kind, groups have the right sizes and members, and the order is
// Megatron-LM's (tensor consecutive, then data, then pipeline). Expected members come from the
// strides of that order (tp: step 1, dp: step t, pp: step t·d), not from the code under test, plus
// the literal example of Megatron-LM's initialize_model_parallel docstring.
//
// Also the one-rank path of the communicator layer that needs no launcher: make_process_groups
// on world size 1, the Local backend, the rank table and the watchdog message format. The suite
// is named process_groups so that `ctest -R "mpi|process_groups"` selects every test of this issue.
#include <gtest/gtest.h>
#include <unistd.h>

#include <set>
#include <tuple>
#include <vector>

#include "runtime/base/abort_hook.h"
#include "runtime/base/error.h"
#include "runtime/comm/comm.h"
#include "runtime/comm/process_groups.h"
#include "runtime/comm/watchdog.h"

namespace strata {
namespace {

using Groups = std::vector<std::vector<int>>;

std::vector<std::tuple<int, int, int>> factorisations(int n) {
  std::vector<std::tuple<int, int, int>> out;
  for (int t = 1; t <= n; ++t) {
    for (int p = 1; p <= n; ++p) {
      if (n % (t * p) == 0) out.emplace_back(t, p, n / (t * p));
    }
  }
  return out;
}

// Every world rank appears in exactly one group of `groups`.
void expect_partition(const Groups& groups, int world, const char* kind) {
  std::vector<int> seen(static_cast<size_t>(world), 0);
  for (const auto& g : groups) {
    for (int r : g) {
      ASSERT_GE(r, 0) << kind;
      ASSERT_LT(r, world) << kind;
      ++seen[r];
    }
  }
  for (int r = 0; r < world; ++r) EXPECT_EQ(seen[r], 1) << kind << " groups, world rank " << r;
}

// Members start at `first` and step by `stride`.
std::vector<int> strided(int first, int stride, int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(first + i * stride);
  return v;
}

TEST(process_groups, EveryFactorisationOf8) {
  const auto all = factorisations(8);
  ASSERT_EQ(all.size(), 10u);  // ordered triples with product 8: C(3+2, 2) for 2^3
  for (const auto& [t, p, d] : all) {
    SCOPED_TRACE("t=" + std::to_string(t) + " p=" + std::to_string(p) + " d=" + std::to_string(d));
    const GroupLayout g = group_layout(t, p, d);
    ASSERT_EQ(g.world_size(), 8);

    ASSERT_EQ(g.tp_groups.size(), static_cast<size_t>(d * p));
    ASSERT_EQ(g.dp_groups.size(), static_cast<size_t>(t * p));
    ASSERT_EQ(g.pp_groups.size(), static_cast<size_t>(t * d));
    ASSERT_EQ(g.mp_groups.size(), static_cast<size_t>(d));
    expect_partition(g.tp_groups, 8, "tp");
    expect_partition(g.dp_groups, 8, "dp");
    expect_partition(g.pp_groups, 8, "pp");
    expect_partition(g.mp_groups, 8, "mp");

    // tp: consecutive blocks of t.
    std::set<std::vector<int>> tp_expected, dp_expected, pp_expected;
    for (int k = 0; k < d * p; ++k) tp_expected.insert(strided(k * t, 1, t));
    // dp: for each (tp, pp), stride t.
    for (int pp = 0; pp < p; ++pp) {
      for (int tp = 0; tp < t; ++tp) dp_expected.insert(strided(tp + pp * t * d, t, d));
    }
    // pp: for each of the first t·d ranks, stride t·d.
    for (int r = 0; r < t * d; ++r) pp_expected.insert(strided(r, t * d, p));
    EXPECT_EQ(std::set<std::vector<int>>(g.tp_groups.begin(), g.tp_groups.end()), tp_expected);
    EXPECT_EQ(std::set<std::vector<int>>(g.dp_groups.begin(), g.dp_groups.end()), dp_expected);
    EXPECT_EQ(std::set<std::vector<int>>(g.pp_groups.begin(), g.pp_groups.end()), pp_expected);

    for (int r = 0; r < 8; ++r) {
      const RankCoord c = g.coord(r);
      EXPECT_EQ(c.tp, r % t);
      EXPECT_EQ(c.dp, (r / t) % d);
      EXPECT_EQ(c.pp, r / (t * d));
      EXPECT_EQ(g.world_rank(c.tp, c.dp, c.pp), r);
      // Group rank = the coordinate of that kind, and *_group_of finds the group.
      EXPECT_EQ(g.tp_groups[g.tp_group_of(r)][c.tp], r);
      EXPECT_EQ(g.dp_groups[g.dp_group_of(r)][c.dp], r);
      EXPECT_EQ(g.pp_groups[g.pp_group_of(r)][c.pp], r);
      EXPECT_EQ(g.mp_groups[g.mp_group_of(r)][c.tp + t * c.pp], r);
      // mp: the t·p ranks of one replica share dp.
      for (int m : g.mp_groups[g.mp_group_of(r)]) EXPECT_EQ(g.coord(m).dp, c.dp);
      // Embedding: first and last stage of the same (tp, dp); middle stages in none.
      const int e = g.embedding_group_of(r);
      if (c.pp == 0 || c.pp == p - 1) {
        ASSERT_GE(e, 0);
        const std::vector<int>& members = g.embedding_groups[e];
        EXPECT_EQ(members.front(), g.world_rank(c.tp, c.dp, 0));
        EXPECT_EQ(members.back(), g.world_rank(c.tp, c.dp, p - 1));
        EXPECT_EQ(members.size(), p == 1 ? 1u : 2u);
      } else {
        EXPECT_EQ(e, -1);
      }
    }
  }
}

TEST(process_groups, MegatronDocstringExample) {
  // Megatron-LM, initialize_model_parallel: 16 GPUs, tensor 2, pipeline 4 (so data 2).
  const GroupLayout g = group_layout(2, 4, 2);
  EXPECT_EQ(g.tp_groups,
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(g.dp_groups,
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(g.pp_groups, (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(g.embedding_groups, (Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
}

TEST(process_groups, HeaderExample) {
  const GroupLayout g = group_layout(2, 2, 2);
  EXPECT_EQ(g.tp_groups, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.dp_groups, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.pp_groups, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.mp_groups, (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
}

// Context × expert on 8 ranks (t 1, c 2, d 4, e 2): world rank = cp + 2·dp. An expert group
// is a run of e data ranks at one context rank; the expert-data group holds every rank of the
// same experts (dp % e) at every context rank, ordered cp + c·(dp / e); the two tile the data ×
// context group.
TEST(process_groups, ContextWithExpertGroups) {
  const GroupLayout g = group_layout(1, 1, 4, 2, 2);
  EXPECT_EQ(g.dp_groups, (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(g.cp_groups, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.ep_groups, (Groups{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(g.edp_groups, (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  // With tensor 2 and pipeline 2 (32 ranks) every rank is in one group of each kind, of the
  // sizes e and c·d/e, and its ep and edp coordinates name its place in them.
  const GroupLayout h = group_layout(2, 2, 4, 2, 2);
  for (int r = 0; r < h.world_size(); ++r) {
    const RankCoord c = h.coord(r);
    const std::vector<int>& ep = h.ep_groups[h.ep_group_of(r)];
    const std::vector<int>& edp = h.edp_groups[h.edp_group_of(r)];
    ASSERT_EQ(ep.size(), 2u);
    ASSERT_EQ(edp.size(), 4u);
    EXPECT_EQ(ep[c.dp % 2], r);
    EXPECT_EQ(edp[c.cp + 2 * (c.dp / 2)], r);
    for (int m : ep) {
      const RankCoord o = h.coord(m);
      EXPECT_TRUE(o.tp == c.tp && o.pp == c.pp && o.cp == c.cp && o.dp / 2 == c.dp / 2) << m;
    }
    for (int m : edp) {
      const RankCoord o = h.coord(m);
      EXPECT_TRUE(o.tp == c.tp && o.pp == c.pp && o.dp % 2 == c.dp % 2) << m;
    }
  }
}

TEST(process_groups, ChunkCounts) {
  EXPECT_EQ(chunk_counts(10, 3), (std::vector<size_t>{4, 3, 3}));
  EXPECT_EQ(chunk_counts(2, 4), (std::vector<size_t>{1, 1, 0, 0}));
  EXPECT_EQ(chunk_counts(0, 2), (std::vector<size_t>{0, 0}));
  EXPECT_EQ(chunk_counts(1025, 8).front(), 129u);
}

// Without a launcher the world has one rank and every group is that rank, on the Local backend.
TEST(process_groups, OneRankWorld) {
  ASSERT_EQ(world().size, 1);
  ProcessGroups g = make_process_groups(1, 1, 1, CommBackend::kMPI, 5);
  EXPECT_EQ(g.prev_stage_rank, -1);
  EXPECT_EQ(g.next_stage_rank, -1);
  EXPECT_TRUE(g.first_stage() && g.last_stage());
  for (Communicator* c : {g.world.get(), g.tp.get(), g.dp.get(), g.pp.get(), g.mp.get(),
                          g.embedding.get(), g.host.get()}) {
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->size(), 1);
    EXPECT_EQ(c->rank(), 0);
    EXPECT_EQ(c->backend(), CommBackend::kLocal);
  }
  EXPECT_THROW(make_process_groups(2, 1, 1, CommBackend::kMPI, 5), InputError);

  const std::string table = rank_table(g, "cpu");
  EXPECT_NE(table.find("world 1 = tensor 1 x pipeline 1 x data 1"), std::string::npos) << table;
  EXPECT_NE(table.find("cpu"), std::string::npos) << table;
}

// The one transport choice: host tensors over MPI; GPU tensors over NCCL only when every rank of
// a host has its own GPU (NCCL refuses two ranks on one device), else staged over MPI.
TEST(process_groups, TransportFollowsWhereTensorsLiveAndDevicesPerHost) {
  struct Case {
    Device d;
    int world, per_host, devices;
    bool nccl;
    CommBackend want;
    bool staged;
  };
  const Case cases[] = {
      {Device::kCPU, 1, 1, 0, false, CommBackend::kLocal, false},
      {Device::kCPU, 8, 4, 8, true, CommBackend::kMPI, false},  // CPU run on a GPU machine
      {Device::kCUDA, 1, 1, 1, true, CommBackend::kLocal, true},
      {Device::kCUDA, 16, 8, 8, true, CommBackend::kNCCL, false},
      {Device::kCUDA, 4, 4, 1, true, CommBackend::kMPI, true},   // four ranks on one GPU
      {Device::kCUDA, 8, 8, 4, true, CommBackend::kMPI, true},   // two per GPU
      {Device::kCUDA, 2, 2, 2, false, CommBackend::kMPI, true},  // built without NCCL
  };
  for (const Case& c : cases) {
    const Transport t = choose_transport(c.d, c.world, c.per_host, c.devices, c.nccl);
    EXPECT_EQ(t.backend, c.want) << to_string(c.d) << " world " << c.world;
    EXPECT_EQ(t.staged, c.staged) << to_string(c.d) << " world " << c.world;
  }
  EXPECT_EQ(to_string(Transport{CommBackend::kMPI, true}), "mpi, staged through host memory");
  EXPECT_EQ(to_string(Transport{CommBackend::kNCCL, false}), "nccl");
  // A schedule that needs buffered sends (interleaved, 2bw) keeps GPU tensors off NCCL, and
  // says why; where NCCL was not possible anyway it changes nothing.
  const Transport buffered = choose_transport(Device::kCUDA, 16, 8, 8, true, true);
  EXPECT_EQ(buffered.backend, CommBackend::kMPI);
  EXPECT_TRUE(buffered.staged);
  EXPECT_EQ(to_string(buffered),
            "mpi, staged through host memory (the pipeline schedule needs buffered sends, which "
            "NCCL's are not; docs/schedules.md)");
  EXPECT_FALSE(choose_transport(Device::kCUDA, 4, 4, 1, true, true).for_buffered_sends);
  EXPECT_EQ(choose_transport(Device::kCPU, 8, 4, 8, true, true).backend, CommBackend::kMPI);
}

TEST(process_groups, LocalCommunicatorCopiesAndMatchesSendsToSelf) {
  auto c = make_world_communicator(CommBackend::kLocal, 5);
  std::vector<float> a = {1, 2, 3}, b(3, 0);
  c->all_reduce(a.data(), a.size(), DType::kF32, ReduceOp::kSum);
  EXPECT_EQ(a, (std::vector<float>{1, 2, 3}));
  c->reduce_scatter(a.data(), b.data(), 3, DType::kF32, ReduceOp::kMax);
  EXPECT_EQ(b, a);
  std::vector<int32_t> x = {7, 8}, y(2, 0), z(2, 0);
  // Receive posted before the send, and a second message queued before its receive: both match
  // in posting order, as MPI does.
  Request r = c->irecv(y.data(), 2, DType::kI32, 0);
  EXPECT_FALSE(r.test());
  c->send(x.data(), 2, DType::kI32, 0);
  r.wait();
  EXPECT_EQ(y, x);
  x = {9, 10};
  c->batch({P2POp::send(x.data(), 2, DType::kI32, 0), P2POp::recv(z.data(), 2, DType::kI32, 0)});
  EXPECT_EQ(z, x);
  EXPECT_EQ(all_gather_strings(*c, "hello"), (std::vector<std::string>{"hello"}));
}

TEST(process_groups, WatchdogMessageNamesPeerGroupBytesAndStep) {
  EXPECT_EQ(
      watchdog_message(3, 300, describe_p2p(false, 2, "pp", 4194304), "stage 1: recv-forward mb 3"),
      "[rank 3] watchdog: no progress for 300 s in recv from world rank 2 (group pp, "
      "4194304 bytes) at schedule step \"stage 1: recv-forward mb 3\"");
  EXPECT_EQ(watchdog_message(0, 2.5, describe_collective("all_reduce", "dp", 4, 16), ""),
            "[rank 0] watchdog: no progress for 2.5 s in all_reduce (group dp, 4 ranks, 16 bytes)");
  {
    WaitContextScope scope("stage 0: send-forward mb 1");
    EXPECT_EQ(wait_context(), "stage 0: send-forward mb 1");
  }
  EXPECT_EQ(wait_context(), "");
}

// Waits yield the core when ranks outnumber this host's cores, unless Open MPI's
// mpi_yield_when_idle was set (OMPI_MCA_mpi_yield_when_idle): then as it says.
TEST(process_groups, WaitsYieldWhenRanksOutnumberCoresOrAsOpenMpiIsTold) {
  EXPECT_FALSE(should_poll_yield(2, 2, nullptr));
  EXPECT_TRUE(should_poll_yield(3, 2, nullptr));
  EXPECT_TRUE(should_poll_yield(1, 0, nullptr));  // core count unknown
  // Network-namespace "hosts" sharing one machine's cores: 2 ranks each, 2 cores seen.
  for (const char* yes : {"1", "true", "TRUE", "yes", "enabled"})
    EXPECT_TRUE(should_poll_yield(2, 2, yes)) << yes;
  for (const char* no : {"0", "false", "No", "disabled"})
    EXPECT_FALSE(should_poll_yield(8, 2, no)) << no;
  // A value Open MPI would not take as a boolean leaves the decision to the core count.
  EXPECT_FALSE(should_poll_yield(2, 2, "sometimes"));
  EXPECT_TRUE(should_poll_yield(3, 2, ""));
}

// A job-wide abort that never returns (MPI_Abort waiting on a launcher daemon that does not
// answer) still ends the process, with its status, once the hook's grace has passed.
TEST(process_groupsDeathTest, AbortEndsTheProcessWhenTheJobWideAbortHangs) {
  EXPECT_EXIT(
      {
        set_abort_hook(
            [](int) {
              for (;;) ::pause();
            },
            0.2);
        abort_job(7);
      },
      ::testing::ExitedWithCode(7), "the job-wide abort did not end this process within 0.2 s");
}

}  // namespace
}  // namespace strata

// Context parallelism in the planner (parallel.context = c): a rank's share of the activations
// (1/c) and the ring attention's buffers against their closed forms, the ring's transfers priced
// against the closed form on made-up links (hidden behind the blocks, exposed on a slow link, all
// of it without overlap), the context group's link, the gradient reduction over data × context,
// the search choosing context where nothing else fits, sequences of a million tokens, and the
// refusals of sizes the runtime does not run.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "launch/config/config_parse.h"
#include "launch/plan/prediction.h"
#include "models/registry.h"
#include "partitioner/planner.h"
#include "runtime/base/behaviour.h"
#include "runtime/base/error.h"

namespace strata {
namespace {

// Two nodes of 8 GPUs with round link figures: NVLink 100 GB/s at efficiency 0.5 and 10 µs,
// NICs of `nic` bytes/s (one per GPU) at efficiency 1 and 20 µs.
Cluster round_cluster(double nic = 10e9, int nodes = 2) {
  const nlohmann::json j = {
      {"name", "round"},
      {"nodes", nodes},
      {"gpus_per_node", 8},
      {"peak_flops", {{"bf16", 1e15}}},
      {"memory_bytes", 80e9},
      {"hbm_bandwidth", 3e12},
      {"intra_node", {{"bandwidth", 100e9}, {"latency_s", 1e-5}, {"efficiency", 0.5}}},
      {"inter_node", {{"bandwidth", nic}, {"latency_s", 2e-5}, {"efficiency", 1.0}}},
      {"nics_per_node", 8}};
  return cluster_from_json(j, "<test>");
}

Cluster h100(int nodes) {
  Cluster c = load_cluster("dgx-h100", configs_dir());
  c.nodes = nodes;
  return c;
}

std::unique_ptr<ModelDescription> llama_8b(int seq_len) {
  return describe_model(
      load_config("", {"model.preset=llama-3.1-8b", "model.seq_len=" + std::to_string(seq_len)})
          .model);
}

ParallelLayout layout(int t, int c, int d, int b) {
  ParallelLayout l;
  l.tensor = t;
  l.context = c;
  l.data = d;
  l.micro_batch_size = b;
  l.num_microbatches = 1;
  l.layers_per_piece = {32};
  return l;
}

// A rank keeps 1/c of every activation (the model's S/c tokens of each sequence); parameters and
// gradients stay whole, ZeRO-1's optimizer state shards over d·c ranks; the buffers add the
// ring's blocks at their backward peak (ring_buffer_bytes): two key/value blocks and four f32
// blocks of their gradients, b·S/c·2·KVH/t·HS · (2·2 + 16) bytes.
TEST(PlannerContext, ActivationsPerRankDivideByContext) {
  const int S = 32768;
  const std::unique_ptr<ModelDescription> m = llama_8b(S);
  const MemoryOptions o = memory_options("bf16", 25, 1, false);
  for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
    for (int t : {1, 2}) {
      ParallelLayout one = layout(t, 1, 1, 1);
      one.recompute = rc;
      one.sequence_parallel = t > 1;
      one.distributed_optimizer = true;
      const MemoryBreakdown base = stage_memory(*m, one, o, {1}).front();
      for (int c : {2, 4}) {
        ParallelLayout cl = one;
        cl.context = c;
        const MemoryBreakdown split = stage_memory(*m, cl, o, {1}).front();
        EXPECT_NEAR(split.activations / (base.activations / c), 1.0, 1e-12)
            << "c " << c << " t " << t << " " << to_string(rc);
        EXPECT_EQ(split.parameters, base.parameters);
        EXPECT_EQ(split.gradients, base.gradients);
        EXPECT_NEAR(split.optimizer, base.optimizer / c, 1e-6 * base.optimizer);
        // Llama 3.1 8B: 8 key/value heads of 128.
        const double block = 1.0 * S / c * 2 * 8 / t * 128;
        EXPECT_DOUBLE_EQ(ring_block_elems(*m, cl), block);
        EXPECT_DOUBLE_EQ(ring_buffer_bytes(*m, cl, 2), block * (2 * 2 + 16));
        // What else changes in the buffers: the fused backward's f32 scratch (b·S·(q/t) and the
        // statistics) by 1/c, and two gradient buckets once d·c > 1.
        const double scratch = 4.0 * (1.0 * S * 4096 / t + 32.0 / t * S);
        const double buckets = 2 * 25.0 * 1024 * 1024;
        const double gather = t > 1 ? 2.0 * S * 4096 : 0;  // the sp all-gather, bf16
        EXPECT_NEAR(split.buffers - base.buffers,
                    block * 20 + buckets - (scratch + gather) * (1 - 1.0 / c), 1.0)
            << "c " << c << " t " << t;
      }
    }
  }
}

// The ring's closed form (cost_model.h) on round figures: forward c − 1 key/value transfers each
// beside a block of attn/c, backward c − 1 key/value + gradient transfers and one more gradient
// transfer home, each beside a block of attn_bwd/c; with overlap only what is longer than the
// block is added, without it the whole transfer.
TEST(PlannerContext, RingPricedAsTheClosedForm) {
  const Link fast{1e9, 0, 1.0}, slow{1e8, 0, 1.0};
  const double attn_f = 8e-3, attn_b = 16e-3, kv = 1e6, dkv = 2e6;
  // Fast: a 1 ms transfer beside 2 ms blocks, 3 ms beside 4 ms backward blocks: all hidden.
  RingTimes r = ring_attention_times(attn_f, attn_b, kv, dkv, 4, fast, true);
  EXPECT_EQ(r.fwd, 0);
  EXPECT_EQ(r.bwd, 0);
  // Slow: 10 ms transfers beside 2 ms blocks: 3 · 8 ms; backward 3 · (30 − 4) + (20 − 4) ms.
  r = ring_attention_times(attn_f, attn_b, kv, dkv, 4, slow, true);
  EXPECT_NEAR(r.fwd, 3 * 8e-3, 1e-12);
  EXPECT_NEAR(r.bwd, 3 * 26e-3 + 16e-3, 1e-12);
  // Without overlap (the host transport): every transfer after its block.
  r = ring_attention_times(attn_f, attn_b, kv, dkv, 4, fast, false);
  EXPECT_NEAR(r.fwd, 3 * 1e-3, 1e-12);
  EXPECT_NEAR(r.bwd, 3 * 3e-3 + 2e-3, 1e-12);
  // A latency per message.
  r = ring_attention_times(attn_f, attn_b, kv, dkv, 2, Link{1e9, 1e-4, 0.5}, false);
  EXPECT_NEAR(r.fwd, 2e-3 + 1e-4, 1e-12);
  EXPECT_NEAR(r.bwd, (2e-3 + 1e-4) + 2 * (4e-3 + 1e-4), 1e-12);
  EXPECT_EQ(ring_attention_times(attn_f, attn_b, kv, dkv, 1, slow, false).fwd, 0);
  // Strata's runtime: overlapped on devices (NCCL moves the blocks alone), not on the host (MPI
  // moves them only inside its calls); the gradients travel in f32.
  EXPECT_EQ(strata_runtime(false, "bf16").ring_overlap, behaviour::kRingOverlapsAttention);
  EXPECT_FALSE(strata_runtime(true, "fp32").ring_overlap);
  EXPECT_EQ(strata_runtime(false, "bf16").ring_grad_wire_bytes, behaviour::kRingGradWireBytes);
}

// A context group is c ranks t apart: NVLink when its t·c ranks lie in one node, else the NICs.
TEST(PlannerContext, GroupLinkFollowsItsSpan) {
  const Cluster cl = round_cluster();
  EXPECT_EQ(context_link(cl, 1, 8).bandwidth, 100e9);
  EXPECT_EQ(context_link(cl, 2, 4).bandwidth, 100e9);
  EXPECT_EQ(context_link(cl, 8, 2).bandwidth, 10e9);  // 8 apart: every hop leaves the node
  EXPECT_EQ(context_link(cl, 2, 3).bandwidth, 10e9);  // spans of 6: some groups cross
  EXPECT_EQ(context_link(cl, 8, 2).latency_s, 2e-5);
}

// On a real layer (Llama 3.1 8B at 131072 tokens, t 8, c 2: the ring crosses nodes): the ring's
// transfers hide behind the attention of 65536 tokens on the H100 preset's NICs, and are exposed
// on a link 10⁴ times slower, by the closed form of what the layer's blocks leave uncovered.
// The rest of the layer is its share: the attention core 1/c of the whole, its GEMMs on S/c rows.
TEST(PlannerContext, RingHiddenBehindComputeExposedOnASlowLink) {
  const std::unique_ptr<ModelDescription> m = llama_8b(131072);
  ParallelLayout c = layout(8, 2, 2, 1);
  c.sequence_parallel = true;
  Cluster fast = h100(2);
  const RuntimeModel rt = strata_runtime(false, "bf16");
  const LayerTimes hidden = layer_times(CostContext{m.get(), &fast, "bf16", nullptr, rt}, c);
  EXPECT_EQ(hidden.cp_fwd, 0);
  EXPECT_EQ(hidden.cp_bwd, 0);
  Cluster slow = fast;
  slow.inter_node.bandwidth = 5e6;  // 5 MB/s NICs (× 8 per node: each GPU its own)
  const LayerTimes exposed = layer_times(CostContext{m.get(), &slow, "bf16", nullptr, rt}, c);
  EXPECT_GT(exposed.cp_fwd, 0);
  EXPECT_GT(exposed.cp_bwd, exposed.cp_fwd);
  // One key/value block: b · S/c · 2 · KVH/t · HS in bf16.
  const double kv = 65536.0 * 2 * 1 * 128 * 2, dkv = kv * 2;
  const double rate = slow.inter_node_bandwidth_per_gpu() * slow.inter_node.efficiency;
  const double lat = slow.inter_node.latency_s;
  // c = 2: one transfer forward; backward one key/value + gradient and one gradient home.
  const double block_f = exposed.layer_fwd - hidden.layer_fwd;  // = transfer − block, forward
  EXPECT_NEAR(block_f, exposed.cp_fwd, 1e-12);
  EXPECT_LT(exposed.cp_fwd, kv / rate + lat);
  EXPECT_GT(exposed.cp_fwd, 0.9 * (kv / rate + lat));
  EXPECT_LT(exposed.cp_bwd, (kv + dkv) / rate + dkv / rate + 2 * lat);
  EXPECT_DOUBLE_EQ(exposed.cp_exposed_per_layer, exposed.cp_fwd + exposed.cp_bwd);
  // Selective recompute runs the forward's ring again in the backward.
  c.recompute = Recompute::kSelective;
  const LayerTimes sel = layer_times(CostContext{m.get(), &slow, "bf16", nullptr, rt}, c);
  EXPECT_NEAR(sel.cp_bwd, exposed.cp_bwd + exposed.cp_fwd, 1e-12);

  // Per rank: the layer's GEMMs on S/c rows, the core's FLOPs 1/c of the whole.
  const RankShape rs{8, true, 1};
  const PartWork whole = m->layer_work(1, rs, 0);
  const PartWork share = context_share(whole, 2);
  ASSERT_EQ(whole.gemms.size(), share.gemms.size());
  for (size_t i = 0; i < whole.gemms.size(); ++i) {
    EXPECT_EQ(share.gemms[i].m, whole.gemms[i].m / 2);
    EXPECT_EQ(share.gemms[i].n, whole.gemms[i].n);
  }
  // Causal: half of 4·b·S²·q/t, over c ranks.
  EXPECT_DOUBLE_EQ(share.attention_flops, 0.5 * 4 * 131072.0 * 131072 * 4096 / 8 / 2);
  EXPECT_EQ(share.attention.seq, 65536);
  ASSERT_EQ(whole.collectives_fwd.size(), share.collectives_fwd.size());
  for (size_t i = 0; i < whole.collectives_fwd.size(); ++i)
    EXPECT_EQ(share.collectives_fwd[i].elements, whole.collectives_fwd[i].elements / 2);
}

// The weight gradients are summed over data × context (d·c ranks t apart, a span of t·c·d), and
// ZeRO-1 shards the state over them: c = 4, d = 2 reduces as d = 8 would.
TEST(PlannerContext, GradientsReduceOverDataTimesContext) {
  const Cluster cl = round_cluster();
  const RuntimeModel rt = strata_runtime(false, "bf16");
  const RankParameters n{1000000, 0};
  for (bool zero : {false, true}) {
    ParallelLayout c = layout(2, 4, 2, 1);
    c.distributed_optimizer = zero;
    ParallelLayout d8 = layout(2, 1, 8, 1);
    d8.distributed_optimizer = zero;
    const DataParallelTimes a = stage_reduction_times(cl, rt, c, n);
    const DataParallelTimes b = stage_reduction_times(cl, rt, d8, n);
    EXPECT_EQ(a.reduce, b.reduce);
    EXPECT_EQ(a.gather, b.gather);
    // 16 ranks' span crosses the node: the NICs its 4 members in a node share, 10 GB/s each.
    const double rate = 40e9;
    const double expect =
        zero ? 7.0 / 8 * 4 * 1e6 / rate + 7 * 2e-5 : 2 * 7.0 / 8 * 4 * 1e6 / rate + 2 * 7 * 2e-5;
    EXPECT_NEAR(a.reduce, expect, 1e-12) << zero;
    EXPECT_EQ(optimizer_shard(c, n), zero ? 1e6 / 8 : 1e6);
  }
  // Context alone (d = 1) still reduces, over its c ranks.
  EXPECT_GT(stage_reduction_times(cl, rt, layout(1, 4, 1, 1), n).reduce, 0);
}

// Llama 3.1 8B at a million tokens a sequence on 4 DGX H100 nodes: nothing fits without
// context parallelism (fixed to 1), the search finds plans that split the sequence, every
// figure finite (no overflow of S² or of the token counts), the context sizes searched all cut
// the sequence into 2c even chunks.
TEST(PlannerContext, MillionTokenSequenceNeedsContext) {
  const int S = 1048576;
  PlanRequest req;
  req.model = llama_8b(S);
  req.cluster = h100(4);
  req.global_batch_size = 32;
  req.memory = memory_options("bf16", 25, 1, false);
  req.fixes.context = 1;
  const PlanOutput without = search_plans(req);
  EXPECT_TRUE(without.plans.empty());
  bool over_memory = false;
  for (const Rejection& r : without.rejected)
    over_memory = over_memory || r.reason.find("over memory") != std::string::npos;
  EXPECT_TRUE(over_memory);

  req.fixes.context.reset();
  const PlanOutput out = search_plans(req);
  ASSERT_FALSE(out.plans.empty());
  EXPECT_GT(out.candidates, without.candidates);
  for (const PlanResult& r : out.plans) {
    const ParallelLayout& c = r.config;
    EXPECT_GT(c.context, 1);
    EXPECT_EQ(S % (2 * c.context), 0);
    EXPECT_EQ(c.tensor * c.context * c.pipeline * c.data, 32);
    EXPECT_TRUE(std::isfinite(r.time.iteration_s) && r.time.iteration_s > 0);
    EXPECT_LE(r.peak_memory, req.cluster.memory_bytes);
    EXPECT_GT(r.memory.front().activations, 0);
    EXPECT_GT(r.mfu, 0.1);
    EXPECT_LT(r.mfu, 1.0);
    EXPECT_EQ(plan_config_json(c)["context"], c.context);
  }
  // The FLOPs of an iteration: per token 3·(2·(weights of the layers and head) + 4·S·h·l), the
  // attention's S² term far beyond int range.
  const double per_token =
      2.0 * (32 * (4096.0 * 6144 + 4096.0 * 4096 + 3 * 4096.0 * 14336) + 4096.0 * 128256) +
      4.0 * S * 4096 * 32;
  const FlopCount f = req.model->flops_per_iteration(32, Recompute::kNone);
  EXPECT_NEAR(f.model / (3 * per_token * 32.0 * S), 1.0, 1e-9);
}

// The context sizes searched cut a sequence into 2c chunks of at least 512 tokens (the
// attention tables' shortest sequence): GPT-2 at 1024 tokens only c = 1, at 4096 c ≤ 4 of the
// 8 GPUs; where context parallelism is not needed it is not chosen for its own sake.
TEST(PlannerContext, ShortSequencesSearchFewContexts) {
  for (const auto& [seq, contexts] :
       {std::pair<int, std::set<int>>{1024, {1}}, {4096, {1, 2, 4}}}) {
    PlanRequest req;
    req.model = describe_model(
        load_config("", {"model.preset=gpt2-124m", "model.seq_len=" + std::to_string(seq)}).model);
    req.cluster = h100(1);
    req.global_batch_size = 64;
    req.fixes.tensor = 1;
    req.fixes.pipeline = 1;
    const PlanOutput out = search_plans(req);
    ASSERT_FALSE(out.plans.empty());
    std::set<int> families;
    for (const Rejection& r : out.rejected)
      if (!r.config.contains("micro_batch_size")) families.insert(r.config["context"].get<int>());
    for (const PlanResult& r : out.plans) families.insert(r.config.context);
    EXPECT_EQ(families, contexts) << seq;
    EXPECT_EQ(out.plans.front().config.context, 1) << seq;
  }
}

// Sizes the runtime refuses are refused with their numbers: a sequence 2c does not cut evenly,
// a world the sizes do not multiply to, sequence parallelism
// over a context rank's tokens t does not divide; by the search (a pinned context) and by
// evaluate_plan.
TEST(PlannerContext, InvalidLayoutsRefusedWithAReason) {
  const std::unique_ptr<ModelDescription> m = llama_8b(8192);
  ParallelLayout c = layout(1, 3, 1, 1);
  EXPECT_EQ(context_invalid_reason(*m, c),
            "context 3 cuts each sequence into 6 chunks: seq_len 8192 is not a multiple of 6");
  c = layout(1, 4, 2, 1);
  EXPECT_EQ(context_invalid_reason(*m, c), "");
  c.expert = 2;  // context composes with expert parallelism
  EXPECT_EQ(context_invalid_reason(*m, c), "");
  const std::unique_ptr<ModelDescription> odd = llama_8b(8 * 1004);  // S/c = 1004 at c = 8
  c = layout(8, 8, 1, 1);
  c.sequence_parallel = true;
  EXPECT_EQ(context_invalid_reason(*odd, c),
            "sequence_parallel needs a context rank's 1004 tokens (seq_len 8032 / context 8) "
            "divisible by tensor 8");

  PlanRequest req;
  req.model = llama_8b(8192);
  req.cluster = h100(1);
  req.global_batch_size = 16;
  ParallelLayout world = layout(1, 2, 2, 1);
  EXPECT_EQ(plan_invalid_reason(*req.model, req.cluster, 16, world),
            "tensor 1 × context 2 × pipeline 1 × data 2 = 4 but the cluster has 8 GPUs");
  // Context 3 on a world of 3 (the world is checked first).
  const ParallelLayout uneven = layout(1, 3, 1, 1);
  req.cluster.gpus_per_node = 3;
  try {
    evaluate_plan(req, uneven);
    ADD_FAILURE() << "context 3 at seq_len 8192 was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("seq_len 8192 is not a multiple of 6"), std::string::npos)
        << e.what();
  }
  req.cluster = h100(1);
  req.fixes.context = 3;
  const PlanOutput out = search_plans(req);
  EXPECT_TRUE(out.plans.empty());
  ASSERT_FALSE(out.rejected.empty());
  for (const Rejection& r : out.rejected) {
    EXPECT_EQ(r.config["context"], 3);
    EXPECT_NE(r.reason.find("context 3"), std::string::npos) << r.reason;
  }
  // A mixture searches expert sizes beside context: context 2 × expert 2 is planned.
  PlanRequest moe;
  moe.model = describe_model(load_config("", {"model.preset=mixtral-8x7b"}).model);
  moe.cluster = h100(4);
  moe.global_batch_size = 256;
  moe.fixes.tensor = 2;
  moe.fixes.pipeline = 4;
  moe.fixes.context = 2;
  moe.fixes.expert = 2;
  const PlanOutput planned = search_plans(moe);
  ASSERT_FALSE(planned.plans.empty());
  EXPECT_EQ(planned.plans[0].config.context, 2);
  EXPECT_EQ(planned.plans[0].config.expert, 2);
}

// The plan's JSON and the rejected families name the context size; the placement says where
// the context groups lie.
TEST(PlannerContext, PlanOutputNamesContext) {
  PlanRequest req;
  req.model = llama_8b(131072);
  req.cluster = h100(4);
  req.global_batch_size = 64;
  req.memory = memory_options("bf16", 25, 1, false);
  req.top_k = 3;
  const PlanOutput out = search_plans(req);
  ASSERT_FALSE(out.plans.empty());
  const PlanResult& best = out.plans.front();
  EXPECT_GT(best.config.context, 1);
  const nlohmann::json j = plan_output_json(req, out);
  EXPECT_EQ(j["plans"][0]["context"], best.config.context);
  EXPECT_TRUE(j["plans"][0]["predicted"].contains("cp_exposed_s"));
  for (const auto& r : j["rejected"]) EXPECT_TRUE(r["config"].contains("context"));
  EXPECT_NE(best.placement.find("context groups of " + std::to_string(best.config.context)),
            std::string::npos)
      << best.placement;
}

}  // namespace
}  // namespace strata

// Tests of the fused variant's blocks: a plan with expert parallelism runs its MoE layers as moe-ffn and one with
// context parallelism its attention and K/V ring as ring-attention, each priced exactly as the operator's own model
// (generator + uncontended timeline) prices the same shape, computed here independently; layouts the operators cannot
// express stay layered and say why.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "mk/algorithms/attention.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/plan/fused.hpp"
#include "mk/plan/placement.hpp"
#include "mk/plan/planner.hpp"
#include "mk/schedule/step_kind.hpp"
#include "mk/topology/topology.hpp"
#include "mk/workload/workload.hpp"

using namespace mk;
using namespace mk::plan;

namespace {

/// A small model on 4 GPUs of one node (one node: the operators are priced by their schedule's closed form).
Workload small() {
  Workload w;
  w.name = "small";
  w.model.layers = 2;
  w.model.hidden = 1024;
  w.model.ffn = 2048;
  w.model.heads = 8;
  w.model.kvHeads = 4;
  w.model.vocab = 8192;
  w.training.seq = 1024;
  w.training.microBatch = 1;
  w.training.globalBatch = 8;
  w.layout.zero = 0;
  return w;
}

Workload smallMoe() {
  Workload w = small();
  MoeSpec moe;
  moe.experts = 8;
  moe.topK = 2;
  moe.ffn = 512;
  w.model.moe = moe;
  w.layout.ep = 4;
  return w;
}

Workload smallCp() {
  Workload w = small();
  w.training.seq = 4096;
  w.layout.cp = 4;
  return w;
}

PlanResult planOn4(const Workload& w) {
  PlanInputs in;
  in.workload = w;
  in.cluster = "dgx-h200";
  in.gpus = {4};
  in.profilePath = MK_DEFAULT_PROFILE;  // no measured folder: the profile's GEMM rate, no validation to run
  auto fused = makeFusedOpPricer();
  return runPlan(in, *fused);
}

/// The block of `kind` and pass of the critical stage.
const FusedBlockUse& block(const ScaleResult& s, FusedBlockKind kind, bool mirror) {
  for (const FusedBlockUse& b : s.fusedBlocks)
    if (b.kind == kind && b.mirror == mirror) return b;
  FAIL("no " << toString(kind) << (mirror ? " backward" : " forward") << " block");
  return s.fusedBlocks.front();
}

/// One run of the layered kernels named `names` on the critical stage.
double layeredUs(const ScaleResult& s, const std::vector<std::string>& names) {
  double us = 0;
  for (const ComputeUse& c : s.compute)
    for (const std::string& n : names)
      if (c.name == n) us += c.us;
  REQUIRE(us > 0);
  return us;
}

/// The operator's own price of `sched` on `ranks` ranks of one node of the plan's cluster, its compute steps at
/// the rate that gives one rank's of them `computeUs`: the uncontended timeline (the model fused.cpp replays across
/// nodes).
double modelUs(const PlanResult& p, const Schedule& sched, uint32_t ranks, double computeUs) {
  Topology one = topologyPreset("dgx-h200");
  one.nodes = 1;
  GroupSet g;
  g.name = "op";
  g.instances = {{}};
  for (uint32_t r = 0; r < ranks; ++r) g.instances[0].push_back(r);
  const ConcurrentPlacement pl = placeConcurrent(g, one);
  Profile prof = p.variants.front().profile;
  fillCtaDefaults(prof, pl.choice);
  double most = 0;
  for (const auto& lanes : sched.lanes) {
    double flops = 0;
    for (const Lane& lane : lanes)
      for (const Step& st : lane.steps)
        if (pricedByFlops(st.kind)) flops += st.flops;
    most = std::max(most, flops);
  }
  prof.gemmTflops = most / (computeUs * 1e6);  // moe-ffn's GEMMs
  prof.attentionTflops = prof.gemmTflops;      // ring-attention's blocks
  return simulateUncontended(sched, prof, pl.choice).totalUs;
}

/// The compute lane's weight a moe-ffn block's split reports ("compute lane weight W against ...").
uint32_t weightOf(const std::string& split) {
  const std::string key = "compute lane weight ";
  const std::size_t at = split.find(key);
  REQUIRE(at != std::string::npos);
  return static_cast<uint32_t>(std::stoul(split.substr(at + key.size())));
}

}  // namespace

TEST_CASE("fused blocks: ep > 1 runs each MoE layer as moe-ffn, priced by the operator's own model") {
  const Workload w = smallMoe();
  const PlanResult p = planOn4(w);
  const ScaleResult& s = p.variants.front().scales.front();
  REQUIRE(s.feasible);
  REQUIRE(s.fusedAvailable);
  const FusedBlockUse& fwd = block(s, FusedBlockKind::MoeFfn, false);
  const FusedBlockUse& bwd = block(s, FusedBlockKind::MoeFfn, true);
  REQUIRE(fwd.priced);
  REQUIRE(bwd.priced);
  // A kind of block runs fused only where that shortens the step: all of a kind or none, the others say why.
  CHECK(fwd.fused == bwd.fused);
  for (const FusedBlockUse* u : {&fwd, &bwd})
    CHECK((u->fused || u->note.find("does not shorten the fused step") != std::string::npos));
  CHECK(fwd.ranks == 4);
  CHECK(fwd.timesPerStep == 2 * s.layout.microBatches);  // two MoE layers per micro-batch
  CHECK(fwd.replaces == std::vector<std::string>{"permute", "expert-up", "expert-act", "expert-down", "unpermute",
                                                 "ep.dispatch", "ep.combine"});
  // The same shape through the generator: 2 experts on each of 4 ranks, top-2 of the rank's 1024 tokens.
  MoeFfnSpec spec;
  spec.experts = 2;
  spec.topk = 2;
  spec.tokens = 1024;
  spec.hidden = 1024;
  spec.ffn = 512;
  Topology one = topologyPreset("dgx-h200");
  one.nodes = 1;
  const double fwdGemm = layeredUs(s, {"expert-up", "expert-down"});
  // The operator's SM split is its own choice, reported in the block's split: priced at it, and no worse than an
  // equal share.
  spec.computeCtas = weightOf(fwd.split);
  CHECK(fwd.us == doctest::Approx(modelUs(p, generateMoeFfn(spec, one.layout(4)), 4, fwdGemm)).epsilon(1e-12));
  MoeFfnSpec equal = spec;
  equal.computeCtas = 1;
  CHECK(fwd.us <= modelUs(p, generateMoeFfn(equal, one.layout(4)), 4, fwdGemm));
  // The backward: the same schedule, computing for the data- and weight-gradient GEMMs' time.
  const double bwdGemm = layeredUs(s, {"expert-up.dgrad", "expert-up.wgrad", "expert-down.dgrad", "expert-down.wgrad"});
  spec.computeCtas = weightOf(bwd.split);
  CHECK(bwd.us == doctest::Approx(modelUs(p, generateMoeFfn(spec, one.layout(4)), 4, bwdGemm)).epsilon(1e-12));
  // The fused step replaced the all-to-alls: the expert-parallel exchanges of the layered step are gone from it,
  // what the operator adds over its kernels is the exposed part.
  CHECK(s.layered.ep.exposedUs > 0);
  if (fwd.fused) CHECK(s.fused.ep.exposedUs + s.fused.ep.hiddenUs > 0);
  CHECK(s.fused.stepUs > 0);
}

TEST_CASE("fused blocks: cp > 1 runs attention and its K/V ring as ring-attention, priced by its own model") {
  const Workload w = smallCp();
  const PlanResult p = planOn4(w);
  const ScaleResult& s = p.variants.front().scales.front();
  REQUIRE(s.feasible);
  REQUIRE(s.fusedAvailable);
  const FusedBlockUse& fwd = block(s, FusedBlockKind::RingAttention, false);
  const FusedBlockUse& bwd = block(s, FusedBlockKind::RingAttention, true);
  REQUIRE(fwd.priced);
  REQUIRE(bwd.priced);
  CHECK(fwd.fused == bwd.fused);
  for (const FusedBlockUse* u : {&fwd, &bwd})
    CHECK((u->fused || u->note.find("does not shorten the fused step") != std::string::npos));
  CHECK(fwd.replaces == std::vector<std::string>{"attention", "cp.ring.kv"});
  CHECK(bwd.replaces == std::vector<std::string>{"attention.bwd", "cp.ring.kv.bwd"});
  RingAttentionSpec spec;
  spec.batch = 1;
  spec.qHeads = 8;
  spec.kvHeads = 4;
  spec.headDim = 128;
  spec.seq = 4096;
  spec.causal = true;
  Profile prof = p.variants.front().profile;
  Topology one = topologyPreset("dgx-h200");
  one.nodes = 1;
  fillCtaDefaults(prof, one);
  spec.computeCtas = prof.sms - 1;
  CHECK(fwd.us ==
        doctest::Approx(modelUs(p, generateRingAttention(spec, one.layout(4)), 4, layeredUs(s, {"attention"})))
            .epsilon(1e-12));
  // The backward: twice the bytes per block (dK and dV travel with K and V), computing for the backward's time.
  spec.headDim = 256;
  CHECK(bwd.us ==
        doctest::Approx(modelUs(p, generateRingAttention(spec, one.layout(4)), 4, layeredUs(s, {"attention.bwd"})))
            .epsilon(1e-12));
  // No ring left to hide behind the attention in the fused step: its exchanges are in the operator.
  if (fwd.fused) CHECK(s.fused.cp.exposedUs + s.fused.cp.hiddenUs > 0);
}

TEST_CASE("fused blocks: what the operators cannot express stays layered and says why") {
  SUBCASE("MLA's two head dims with context parallelism") {
    Workload w = smallCp();
    MlaSpec mla;
    mla.kvLoraRank = 256;
    mla.qkNopeHeadDim = 64;
    mla.qkRopeHeadDim = 32;
    mla.vHeadDim = 64;
    w.model.mla = mla;
    w.model.kvHeads = w.model.heads;  // latent attention: one key/value head per query head
    const PlanResult p = planOn4(w);
    const ScaleResult& s = p.variants.front().scales.front();
    REQUIRE(s.fusedAvailable);
    const FusedBlockUse& b = block(s, FusedBlockKind::RingAttention, false);
    CHECK_FALSE(b.fused);
    CHECK(b.note.find("one head dim") != std::string::npos);
  }
  SUBCASE("expert tensor parallelism") {
    Workload w = smallMoe();
    w.layout.ep = 2;
    w.layout.etp = 2;
    const PlanResult p = planOn4(w);
    const ScaleResult& s = p.variants.front().scales.front();
    REQUIRE(s.fusedAvailable);
    const FusedBlockUse& b = block(s, FusedBlockKind::MoeFfn, false);
    CHECK_FALSE(b.fused);
    CHECK(b.note.find("layout.etp 2") != std::string::npos);
  }
  SUBCASE("a hidden size the operator's GEMM engine cannot take (the generator's own check)") {
    Workload w = smallMoe();
    w.model.hidden = 1020;
    w.model.heads = 6;  // head dim 170
    w.model.kvHeads = 2;
    const PlanResult p = planOn4(w);
    const ScaleResult& s = p.variants.front().scales.front();
    REQUIRE(s.fusedAvailable);
    const FusedBlockUse& b = block(s, FusedBlockKind::MoeFfn, false);
    CHECK_FALSE(b.fused);
    CHECK(b.note.find("hidden") != std::string::npos);
    CHECK(b.note.find("kept layered") != std::string::npos);
  }
  SUBCASE("a sequence the zigzag cannot split (the generator's own check, through the pricer)") {
    FusedBlockRequest rq;
    rq.block.kind = FusedBlockKind::RingAttention;
    rq.block.batch = 1;
    rq.block.heads = 8;
    rq.block.kvHeads = 4;
    rq.block.headDim = 128;
    rq.block.seq = 4100;  // not a multiple of 2 x 4
    Topology one = topologyPreset("dgx-h200");
    one.nodes = 1;
    GroupSet g;
    g.instances = {{0, 1, 2, 3}};
    rq.placement = placeConcurrent(g, one);
    const Profile prof = defaultProfile(one);
    rq.cluster = &one;
    rq.profile = &prof;
    rq.computeUs = 100;
    CHECK_THROWS_WITH_AS(priceFusedBlock(rq), doctest::Contains("seq 4100"), Error);
  }
}

TEST_CASE("fused blocks: a moe-ffn block across nodes runs the return its replay prices lower") {
  // An expert-parallel group of 8 holding 4 GPUs of each of two dgx-h100 nodes, one expert per rank.
  Topology two = topologyPreset("dgx-h100", 2);
  GroupSet g;
  g.instances = {{0, 1, 2, 3, 8, 9, 10, 11}};
  const Profile prof = defaultProfile(two);
  FusedBlockRequest rq;
  rq.block.kind = FusedBlockKind::MoeFfn;
  rq.block.experts = 1;
  rq.block.tokens = 2048;
  rq.placement = placeConcurrent(g, two);
  REQUIRE(rq.placement.multiNode);
  rq.cluster = &two;
  rq.profile = &prof;
  rq.computeUs = 2000;
  // Mixtral's top-2 of 8 (hidden 4096, ffn 14336): a row per (token, k) is the cheaper return; top-8 of 8 at
  // DeepSeek-V3's hidden 7168 and ffn 2048: every token names all 4 experts of the other node, summed into one row.
  for (const auto& [topk, hidden, ffn, want] :
       {std::tuple<uint64_t, uint64_t, uint64_t, const char*>{2, 4096, 14336, "per-block"},
        {8, 7168, 2048, "node-sum"}}) {
    rq.block.topk = topk;
    rq.block.hidden = hidden;
    rq.block.ffn = ffn;
    const FusedOpPrice p = priceFusedBlock(rq);
    INFO(p.split);
    CHECK(p.split.find(std::string(", combine ") + want + " (") != std::string::npos);
    CHECK(p.source.find("replayed by SimGrid") != std::string::npos);
  }
}

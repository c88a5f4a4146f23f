// Tests of the layout's rank grid (Megatron-LM's tp-cp-ep-dp-pp order), expert parallelism drawn from dp x cp,
// expert tensor parallelism, and context parallelism's lowering for each layout.cpCommType, against hand
// computations.
#include <doctest/doctest.h>

#include <string>
#include <tuple>
#include <vector>

#include "mk/error.hpp"
#include "mk/workload/lowering.hpp"
#include "mk/workload/memory.hpp"
#include "mk/workload/workload.hpp"

using namespace mk;

namespace {

using Ranks = std::vector<std::vector<uint32_t>>;

/// 2 layers, hidden 256, 8 heads of 32, 4 KV heads, 8 experts of top 2; seq 1024, one sequence per micro-batch.
Workload tiny(uint32_t tp, uint32_t cp, uint32_t pp, uint32_t ep) {
  Workload w;
  w.name = "tiny";
  w.model.layers = 2;
  w.model.hidden = 256;
  w.model.ffn = 512;
  w.model.heads = 8;
  w.model.kvHeads = 4;
  w.model.vocab = 1024;
  w.model.moe = MoeSpec{8, 2, 0};
  w.training.seq = 1024;
  w.training.microBatch = 1;
  w.training.globalBatch = 8;
  w.layout.tp = tp;
  w.layout.cp = cp;
  w.layout.pp = pp;
  w.layout.ep = ep;
  w.layout.zero = 1;
  validateWorkload(w);
  return w;
}

const GroupSet& groups(const StageLowering& s, const std::string& name) {
  for (const GroupSet& g : s.groups)
    if (g.name == name) return g;
  FAIL("no group set " << name);
  return s.groups.front();
}

const CommOp* findComm(const StageLowering& s, const std::string& name) {
  for (const CommOp& c : s.comm)
    if (c.name == name) return &c;
  return nullptr;
}

const ComputeOp& findOp(const StageLowering& s, const std::string& name) {
  for (const ComputeOp& op : s.compute)
    if (op.name == name) return op;
  FAIL("no op " << name);
  return s.compute.front();
}

double attentionFlops(const StageLowering& s) {
  double f = 0;
  for (const ComputeOp& op : s.compute)
    if (op.kind == ComputeKind::Attention) f += op.flops * op.times;
  return f;
}

std::string errorOf(const Workload& w, uint32_t gpus) {
  try {
    validateWorkload(w);
    (void)resolveLayout(w, gpus);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("layout: tp 2, cp 2, dp 2, pp 2, ep 4 — every group as Megatron-LM's tp-cp-ep-dp-pp grid") {
  const Workload w = tiny(2, 2, 2, 4);
  const ResolvedLayout r = resolveLayout(w, 16);
  CHECK(r.dp == 2);
  CHECK(r.edp == 2);  // tp x cp x dp / (etp x ep) = 8 / 4
  const StepLowering step = lowerStep(w, r);
  // Rank = t + 2 c + 4 d + 8 s, by hand.
  const StageLowering& s0 = step.stages[0];
  CHECK(groups(s0, "tp").instances == Ranks{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(groups(s0, "cp").instances == Ranks{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(groups(s0, "cp.ring").instances == Ranks{{0, 2}, {1, 3}, {4, 6}, {5, 7}});  // even positions send
  CHECK(groups(s0, "dp").instances == Ranks{{0, 2, 4, 6}, {1, 3, 5, 7}});           // dp x cp: the gradients' group
  CHECK(groups(s0, "ep").instances == Ranks{{0, 2, 4, 6}, {1, 3, 5, 7}});
  CHECK(groups(s0, "edp").instances == Ranks{{0, 1}, {2, 3}, {4, 5}, {6, 7}});  // the same 2 experts, whole
  CHECK(groups(s0, "pp").instances == Ranks{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}});
  const StageLowering& s1 = step.stages[1];
  CHECK(groups(s1, "cp").instances == Ranks{{8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(groups(s1, "ep").instances == Ranks{{8, 10, 12, 14}, {9, 11, 13, 15}});
  // The dense gradients are reduce-scattered over dp x cp = 4 ranks, the experts' over edp = 2.
  const CommOp* dp = findComm(s0, "dp.rs");
  REQUIRE(dp);
  CHECK(s0.groups[dp->groups].instances[0].size() == 4);
  const CommOp* edp = findComm(s0, "edp.rs");
  REQUIRE(edp);
  CHECK(s0.groups[edp->groups].instances[0].size() == 2);
}

TEST_CASE("layout: ep drawn from dp x cp (ep 64, dp 32, cp 2), or across tp with etp 1 (ep 8, dp x cp 4)") {
  Workload w = tiny(1, 2, 1, 1);
  w.model.moe = MoeSpec{64, 8, 0};
  w.layout.ep = 64;
  w.layout.dp = 32;
  w.training.globalBatch = 64;
  validateWorkload(w);  // once "layout.ep 64 does not divide layout.dp 32"
  const ResolvedLayout r = resolveLayout(w, 64);
  CHECK(r.dp == 32);
  CHECK(r.edp == 1);
  const StepLowering step = lowerStep(w, r);
  CHECK(groups(step.stages[0], "ep").instances[0].size() == 64);
  CHECK(findComm(step.stages[0], "ep.dispatch"));

  const Workload w8 = tiny(2, 2, 1, 8);  // dp x cp = 4: the expert grid's ep consecutive ranks, across tp
  const StepLowering s8 = lowerStep(w8, resolveLayout(w8, 8));
  CHECK(groups(s8.stages[0], "ep").instances == Ranks{{0, 1, 2, 3, 4, 5, 6, 7}});
  CHECK(!findComm(s8.stages[0], "edp.rs"));  // every expert on one rank
}

TEST_CASE("layout: bad context- and expert-parallel layouts are refused naming the field") {
  Workload w = tiny(1, 4, 1, 1);
  w.training.seq = 1020;  // a multiple of cp 4, not of 2 cp: the zigzag's chunks
  CHECK(errorOf(w, 4).find("layout.cp 4 needs training.seq 1020 to be a multiple of 8") != std::string::npos);
  w.layout.cpCommType = CpCommType::AllGather;
  CHECK(errorOf(w, 4) == "");
  w.training.seq = 1024;
  w.layout.cp = 8;
  w.layout.cpCommType = CpCommType::A2a;  // 4 KV heads over 8 ranks
  CHECK(errorOf(w, 8).find("layout.cp 8 must divide the key/value heads") != std::string::npos);
  w.layout.cpCommType = CpCommType::A2aP2p;
  CHECK(errorOf(w, 8).find("layout.cpA2aSize must be > 1") != std::string::npos);
  w.layout.cpA2aSize = 2;
  CHECK(errorOf(w, 8) == "");
  w.layout.cpCommType = CpCommType::P2p;
  CHECK(errorOf(w, 8).find("layout.cpA2aSize is for layout.cpCommType \"a2a+p2p\"") != std::string::npos);
  w.layout.cpA2aSize = 0;
  w.layout.etp = 2;
  CHECK(errorOf(w, 8) == "");  // expert tensor parallelism, once refused ("layout.etp must be 1")
  w.layout.etp = 1;
  w.layout.ep = 8;  // dp x cp = 8 x 8 at 64 GPUs
  CHECK(errorOf(w, 64) == "");
  w.model.moe = MoeSpec{16, 2, 0};
  w.layout.ep = 16;
  w.training.globalBatch = 24;
  CHECK(errorOf(w, 24).find("layout.ep 16 divides neither dp x cp = 24 nor tp x cp x dp / etp = 24 at 24 GPUs") !=
        std::string::npos);
  // The JSON names its field.
  try {
    applyLayoutJson(w, R"({"cpCommType": "ring"})", "layout.json");
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("cpCommType must be \"p2p\", \"all-gather\", \"a2a\" or \"a2a+p2p\"") !=
          std::string::npos);
  }
  Workload j = tiny(1, 1, 1, 1);
  applyLayoutJson(j, R"({"cp": 2, "cpCommType": "all-gather", "etp": 1})", "layout.json");
  CHECK(j.layout.cp == 2);
  CHECK(j.layout.cpCommType == CpCommType::AllGather);
  CHECK(workloadFromJson(workloadToJson(j)).layout.cpCommType == CpCommType::AllGather);
}

TEST_CASE("lowering: context parallelism's FLOPs and bytes for each cpCommType, by hand") {
  // cp 4 on tp 1: T = 1024 / 4 = 256 tokens per rank, 8 query and 4 KV heads of 32.
  const Workload w1 = tiny(1, 1, 1, 1);
  const StageLowering one = lowerStep(w1, resolveLayout(w1, 1)).stages[0];
  const double layers = 2, T = 256, d = 32, kv = 2 * T * 4 * d;  // the rank's K and V: 65536 elements
  for (CpCommType type : {CpCommType::P2p, CpCommType::AllGather, CpCommType::A2a, CpCommType::A2aP2p}) {
    CAPTURE(toString(type));
    Workload w = tiny(1, 4, 1, 1);
    w.layout.cpCommType = type;
    if (type == CpCommType::A2aP2p) w.layout.cpA2aSize = 2;
    const StageLowering s = lowerStep(w, resolveLayout(w, 4)).stages[0];
    // The causal attention work is split evenly (zigzag or heads), every other op sees T / cp tokens.
    CHECK(attentionFlops(s) == doctest::Approx(attentionFlops(one) / 4).epsilon(1e-12));
    CHECK(findOp(s, "qkv").m == 256);
    CHECK(findOp(s, "attn-norm").tokens == 256);
    const ComputeOp& att = findOp(s, "attention");
    switch (type) {
      case CpCommType::P2p: {
        CHECK(att.m == 256);
        CHECK(att.n == 1024);
        CHECK(att.flops == doctest::Approx(4.0 * 256 * 1024 * 32 * 0.5 * 8));
        // Q and O of 256 rows, every K/V block once (1024 rows of 4 heads), the fp32 log-sum-exp.
        CHECK(att.bytes == doctest::Approx(2 * (2 * 256 * 8 * 32.0) + 2 * (2 * 1024 * 4 * 32.0) + 256 * 8 * 4.0));
        const CommOp* f = findComm(s, "cp.ring.kv");
        const CommOp* b = findComm(s, "cp.ring.kv.bwd");
        REQUIRE(f);
        REQUIRE(b);
        CHECK(f->kind == CommKind::SendRecv);
        CHECK(f->timing == CommTiming::AttentionRing);
        CHECK(f->count == kv);
        CHECK(f->times == layers * 3);  // cp - 1 steps a layer
        CHECK(b->count == 2 * kv);      // K/V and dK/dV
        CHECK(b->times == layers * 3);
        CHECK(commBytes(*f, 2) == 2 * kv);
        break;
      }
      case CpCommType::AllGather: {
        CHECK(att.m == 256);
        const CommOp* g = findComm(s, "cp.ag.kv");
        REQUIRE(g);
        CHECK(g->count == kv);
        CHECK(g->timing == CommTiming::Blocking);
        CHECK(commBytes(*g, 4) == 4 * kv * 2);  // the gathered K/V of the sequence in bf16
        REQUIRE(findComm(s, "cp.ag.kv.bwd"));
        const CommOp* rs = findComm(s, "cp.rs.dkv");
        REQUIRE(rs);
        CHECK(rs->kind == CommKind::ReduceScatter);
        CHECK(rs->count == kv);
        CHECK(!findComm(s, "cp.ring.kv"));
        break;
      }
      case CpCommType::A2a: {
        CHECK(att.m == 1024);
        CHECK(att.heads == 2);
        CHECK(att.kvHeads == 1);
        const CommOp* q = findComm(s, "cp.a2a.qkv");
        const CommOp* o = findComm(s, "cp.a2a.out");
        REQUIRE(q);
        REQUIRE(o);
        CHECK(q->kind == CommKind::AllToAll);
        CHECK(q->count == (8 + 2 * 4) * d * T / 4);  // per destination: a quarter of the rank's Q, K, V
        CHECK(o->count == 8 * d * T / 4);
        CHECK(findComm(s, "cp.a2a.qkv.bwd")->count == q->count);
        CHECK(findComm(s, "cp.a2a.out.bwd")->count == o->count);
        CHECK(!findComm(s, "cp.ring.kv"));
        break;
      }
      case CpCommType::A2aP2p: {
        CHECK(att.m == 512);  // a2a over 2 ranks, then a ring of 2
        CHECK(att.heads == 4);
        CHECK(findComm(s, "cp.a2a.qkv")->count == (8 + 2 * 4) * d * T / 2);
        const CommOp* f = findComm(s, "cp.ring.kv");
        REQUIRE(f);
        CHECK(f->count == kv);
        CHECK(f->times == layers * 1);
        CHECK(s.groups[f->groups].instances[0] == std::vector<uint32_t>{0, 2});
        CHECK(s.groups[findComm(s, "cp.a2a.qkv")->groups].instances[0] == std::vector<uint32_t>{0, 1});
        break;
      }
    }
  }
}

TEST_CASE("memory: context parallelism divides activations by cp and shards ZeRO state over dp x cp") {
  Workload w = tiny(1, 1, 1, 1);
  w.model.moe.reset();
  const MemoryEstimate m1 = estimateMemory(w, lowerStep(w, resolveLayout(w, 2)));  // dp 2
  w.layout.cp = 2;
  const MemoryEstimate m2 = estimateMemory(w, lowerStep(w, resolveLayout(w, 4)));  // dp 2 x cp 2
  CHECK(m2.activations == doctest::Approx(m1.activations / 2));
  CHECK(m2.optimizer == doctest::Approx(m1.optimizer / 2));
}

TEST_CASE("lowering: MoE routing — imbalance and a capacity factor set the busiest rank's rows and blocks") {
  // ep 4 on 4 GPUs: 1024 tokens, top 2 of 8 experts, 2 experts a rank: 1024 rows an expert balanced.
  auto at = [](double imbalance, double capacity) {
    Workload w = tiny(1, 1, 1, 4);
    w.model.moe->imbalance = imbalance;
    w.model.moe->capacityFactor = capacity;
    validateWorkload(w);
    return lowerStep(w, resolveLayout(w, 4)).stages[0];
  };
  for (auto [imbalance, capacity, load] :
       {std::tuple{1.0, 0.0, 1.0}, {1.5, 0.0, 1.5}, {1.5, 1.25, 1.25}, {1.0, 0.5, 0.5}}) {
    CAPTURE(imbalance);
    CAPTURE(capacity);
    const StageLowering s = at(imbalance, capacity);
    CHECK(findOp(s, "expert-up").m == static_cast<uint64_t>(1024 * load));
    CHECK(findOp(s, "expert-up").batch == 2);
    CHECK(findOp(s, "expert-act").tokens == static_cast<uint64_t>(2 * 1024 * load));
    CHECK(findComm(s, "ep.dispatch")->count == static_cast<uint64_t>(1024 * 2 * 256 / 4 * load));
    CHECK(findComm(s, "ep.combine.bwd")->count == static_cast<uint64_t>(1024 * 2 * 256 / 4 * load));
    CHECK(findOp(s, "permute").tokens == 1024);  // each rank permutes its own tokens, dropped ones included
  }
  // JSON: written when set, read back; bad values name the field.
  Workload w = tiny(1, 1, 1, 4);
  w.model.moe->imbalance = 1.5;
  w.model.moe->capacityFactor = 1.25;
  const Workload back = workloadFromJson(workloadToJson(w));
  CHECK(back.model.moe->imbalance == 1.5);
  CHECK(back.model.moe->capacityFactor == 1.25);
  auto errorOfJson = [](const std::string& moe) {
    try {
      (void)workloadFromJson(R"({"preset": "mixtral-8x22b", "model": {"moe": )" + moe + "}}");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(errorOfJson(R"({"imbalance": 0.5})").find("model.moe.imbalance must be >= 1") != std::string::npos);
  CHECK(errorOfJson(R"({"capacityFactor": 0})").find("model.moe.capacityFactor must be > 0") != std::string::npos);
  CHECK(errorOfJson(R"({"routing": "random"})").find("model.moe.routing must be \"balanced\"") != std::string::npos);
  CHECK(errorOfJson(R"({"imbalance": 9})").find("model.moe.imbalance 9 exceeds layout.ep 8") != std::string::npos);
  CHECK(errorOfJson(R"({"routing": "balanced", "imbalance": 2})") == "");
}

TEST_CASE("layout: expert tensor parallelism, etp 2 with tp 2 and ep 2 on 8 GPUs: grid, GEMMs, collectives, memory") {
  Workload w = tiny(2, 1, 1, 2);
  w.layout.etp = 2;
  validateWorkload(w);
  const ResolvedLayout r = resolveLayout(w, 8);  // dp 4
  CHECK(r.edp == 2);                             // tp x cp x dp / (etp x ep) = 8 / 4
  const StepLowering step = lowerStep(w, r);
  const StageLowering& s = step.stages[0];
  // Megatron-LM's expert grid etp-ep-edp: local rank = e_t + 2 (e_e + 2 e_d).
  CHECK(groups(s, "etp").instances == Ranks{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(groups(s, "ep").instances == Ranks{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(groups(s, "edp").instances == Ranks{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  // A rank routes T / tp = 512 tokens x top 2; an expert's rows come from the etp x ep = 4 ranks whose tokens reach
  // its etp group, spread over 8 experts: 512 x 2 x 4 / 8 = 512 rows; its columns are ffn / etp = 256.
  const ComputeOp& up = findOp(s, "expert-up");
  CHECK(up.m == 512);
  CHECK(up.n == 2 * 256);  // gate and up
  CHECK(up.k == 256);
  CHECK(up.batch == 4);  // 8 experts over ep 2
  const ComputeOp& down = findOp(s, "expert-down");
  CHECK(down.m == 512);
  CHECK(down.n == 256);
  CHECK(down.k == 256);
  CHECK(findOp(s, "expert-act").tokens == 512 * 4);
  // The all-to-all is unchanged (512 x 2 x 256 / ep per destination); what it brought is all-gathered over etp
  // before the experts and reduce-scattered after, mirrored in the backward pass, on the etp groups.
  const CommOp* a2a = findComm(s, "ep.dispatch");
  REQUIRE(a2a);
  CHECK(a2a->count == 512 * 2 * 256 / 2);
  const std::vector<std::tuple<std::string, CommKind, Pass>> etp = {
      {"etp.ag.dispatch", CommKind::AllGather, Pass::Forward},
      {"etp.rs.combine", CommKind::ReduceScatter, Pass::Forward},
      {"etp.ag.combine.bwd", CommKind::AllGather, Pass::Backward},
      {"etp.rs.dispatch.bwd", CommKind::ReduceScatter, Pass::Backward}};
  for (const auto& [name, kind, pass] : etp) {
    const CommOp* c = findComm(s, name);
    REQUIRE(c);
    CHECK(c->kind == kind);
    CHECK(c->pass == pass);
    CHECK(c->count == 512 * 2 * 256);  // per rank: everything its all-to-all received
    CHECK(c->times == 2);              // both layers are MoE layers
    CHECK(s.groups[c->groups].name == "etp");
  }
  std::size_t onEtp = 0;
  for (const CommOp& c : s.comm) onEtp += s.groups[c.groups].name == "etp" ? 1 : 0;
  CHECK(onEtp == 4);
  // Against whole experts (etp 1): the same expert FLOPs, half the expert parameters per GPU.
  const Workload w1 = tiny(2, 1, 1, 2);
  const StepLowering one = lowerStep(w1, resolveLayout(w1, 8));
  const StageLowering& s1 = one.stages[0];
  CHECK(!findComm(s1, "etp.ag.dispatch"));
  CHECK(findOp(s1, "expert-up").flops == doctest::Approx(up.flops));
  CHECK(findOp(s1, "expert-down").flops == doctest::Approx(down.flops));
  CHECK(s.expertParams == doctest::Approx(2.0 * 4 * 3 * 256 * 512 / 2));  // layers x local experts x 3 h f / etp
  CHECK(s1.expertParams == doctest::Approx(2 * s.expertParams));
  CHECK(s.denseParams == doctest::Approx(s1.denseParams));
  // Memory: bf16 weights and fp32 gradients of the experts halve; ZeRO 1 shards the experts' optimizer state over
  // edp (4 with etp 1, 2 with etp 2): 1 / (etp x ep x edp) of every expert either way.
  const MemoryEstimate m2 = estimateMemory(w, step), m1 = estimateMemory(w1, one);
  CHECK(m1.weights - m2.weights == doctest::Approx(2.0 * s.expertParams));
  CHECK(m1.gradients - m2.gradients == doctest::Approx(4.0 * s.expertParams));
  CHECK(m2.optimizer == doctest::Approx(m1.optimizer));
  CHECK(m2.optimizer - 12 * s.denseParams / 4 == doctest::Approx(12 * s.expertParams / 2));
  const CommOp* edp = findComm(s, "edp.rs");
  REQUIRE(edp);
  CHECK(s.groups[edp->groups].instances[0].size() == 2);
}

TEST_CASE("layout: an expert tensor parallelism that cannot split is refused naming layout.etp") {
  Workload w = tiny(2, 1, 1, 2);
  w.layout.etp = 8;  // 8 ranks / ep 2 = 4
  CHECK(errorOf(w, 8).find("layout.etp 8 does not divide tp x cp x dp / layout.ep = 4 at 8 GPUs") != std::string::npos);
  w.layout.dp = 4;
  CHECK(errorOf(w, 8).find("layout.etp 8 does not divide layout.tp x layout.cp x layout.dp / layout.ep = 4") !=
        std::string::npos);
  w.layout.dp.reset();
  w.layout.etp = 3;
  CHECK(errorOf(w, 24).find("layout.etp 3 does not divide the experts' intermediate size 512 (model.ffn)") !=
        std::string::npos);
  w.layout.etp = 2;
  w.layout.ep = 1;
  w.model.moe.reset();
  CHECK(errorOf(w, 8).find("layout.etp 2 needs a mixture-of-experts model (model.moe)") != std::string::npos);
}

TEST_CASE("lowering: fused blocks — a2a+p2p's whole rings, the MoE layer and ring-attention's shapes and ops") {
  // cp 4 as two a2a groups of 2: rings over the ranks of one position in those groups (tp 1: ranks c0 + c).
  Workload w = tiny(1, 4, 1, 2);
  w.layout.cpCommType = CpCommType::A2aP2p;
  w.layout.cpA2aSize = 2;
  const StepLowering step = lowerStep(w, resolveLayout(w, 8));
  const StageLowering& s = step.stages[0];
  CHECK(groups(s, "cp.ring.ranks").instances == Ranks{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  // Every block names the ops it replaces; ring-attention's shape is the attention's after the a2a.
  std::vector<std::string> seen;
  for (const FusedBlock& b : s.fusedBlocks) {
    std::string names;
    for (uint32_t i : b.compute) names += s.compute[i].name + " ";
    for (uint32_t i : b.comm) names += s.comm[i].name + " ";
    seen.push_back(std::string(toString(b.kind)) + (b.mirror ? " bwd: " : ": ") + names);
    CHECK(b.unfusable.empty());
    CHECK(b.times == 2);
    if (b.kind == FusedBlockKind::RingAttention) {
      CHECK(s.groups[b.groups].name == "cp.ring.ranks");
      CHECK(b.heads == 8 / 2);  // the a2a's 2 ranks split the heads
      CHECK(b.kvHeads == 4 / 2);
      CHECK(b.headDim == 32);
      CHECK(b.seq == 1024);
    } else {
      CHECK(s.groups[b.groups].name == "ep");
      CHECK(b.tokens == 1024 / 4);
      CHECK(b.experts == 8 / 2);
      CHECK(b.topk == 2);
      CHECK(b.hidden == 256);
      CHECK(b.ffn == 512);
    }
  }
  CHECK(seen == std::vector<std::string>{
                    "ring-attention: attention cp.ring.kv ",
                    "moe-ffn: permute expert-up expert-act expert-down unpermute ep.dispatch ep.combine ",
                    "ring-attention bwd: attention.bwd cp.ring.kv.bwd ",
                    "moe-ffn bwd: permute.bwd expert-up.dgrad expert-up.wgrad expert-act.bwd expert-down.dgrad "
                    "expert-down.wgrad unpermute.bwd ep.combine.bwd ep.dispatch.bwd ",
                });
  // Expert tensor parallelism: the block is there, marked as one moe-ffn cannot run.
  Workload e = tiny(2, 1, 1, 2);
  e.layout.etp = 2;
  const StepLowering eStep = lowerStep(e, resolveLayout(e, 8));  // held: its stages are read below
  const StageLowering& es = eStep.stages[0];
  REQUIRE(!es.fusedBlocks.empty());
  CHECK(es.fusedBlocks[0].unfusable.find("layout.etp 2") != std::string::npos);
}

// Tests of lowering a training step: parameter and FLOP counts against independent formulas, the collectives of
// each parallel dimension, rank groups, fused candidates, memory.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "mk/workload/lowering.hpp"
#include "mk/workload/memory.hpp"
#include "mk/workload/workload.hpp"

using namespace mk;

namespace {

Workload llama8b(uint32_t tp, uint32_t pp, bool sp) {
  Workload w = workloadPreset("llama3-8b");
  w.layout.tp = tp;
  w.layout.pp = pp;
  w.layout.sp = sp;
  return w;
}

const CommOp* findComm(const StageLowering& s, const std::string& name) {
  for (const CommOp& c : s.comm)
    if (c.name == name) return &c;
  return nullptr;
}

double sumFlops(const StageLowering& s, ComputeKind kind) {
  double f = 0;
  for (const ComputeOp& op : s.compute)
    if (op.kind == kind && !op.recompute) f += op.flops * op.times;
  return f;
}

}  // namespace

TEST_CASE("lowering: the parameters of Llama 3 8B add up to its published count, 8 030 261 248") {
  // Embedding and untied output (128256 x 4096 each), 32 layers of attention (q 4096x4096, k and v 4096x1024,
  // o 4096x4096), SwiGLU MLP (3 x 4096 x 14336), two norms, and the final norm.
  const Workload w = llama8b(1, 1, false);
  const StepLowering step = lowerStep(w, resolveLayout(w, 1));
  REQUIRE(step.stages.size() == 1);
  CHECK(step.stages[0].denseParams == doctest::Approx(8030261248.0).epsilon(1e-12));
  CHECK(step.stages[0].expertParams == 0);

  // Split over 4 stages: the layers' and the embedding / head parameters land on their stages.
  const Workload w4 = llama8b(1, 4, false);
  const StepLowering s4 = lowerStep(w4, resolveLayout(w4, 4));
  double sum = 0;
  for (const auto& st : s4.stages) sum += st.denseParams;
  CHECK(sum == doctest::Approx(8030261248.0).epsilon(1e-12));
  CHECK(s4.stages[0].embedding);
  CHECK(s4.stages[3].head);
  CHECK(s4.stages[0].denseParams > s4.stages[1].denseParams);
}

TEST_CASE("lowering: GEMM FLOPs are 6 x matrix parameters x tokens, split exactly by tensor parallelism") {
  const Workload w1 = llama8b(1, 1, false);
  const StepLowering s1 = lowerStep(w1, resolveLayout(w1, 1));
  const double tokens = 8192;  // one micro-batch of one sequence
  // Matrix parameters: everything but the embedding table (a lookup) and the norm vectors.
  const double h = 4096, layers = 32;
  const double matrices = layers * (h * 6144 + h * h + 3 * h * 14336) + 128256 * h;
  CHECK(sumFlops(s1.stages[0], ComputeKind::Gemm) == doctest::Approx(6 * matrices * tokens).epsilon(1e-12));
  // Attention: QK^T and PV, 2 s^2 d per head under the causal mask, forward; backward 2.5 x that.
  const double attnFwd = 2.0 * tokens * tokens * 128 * 32 * layers;
  CHECK(sumFlops(s1.stages[0], ComputeKind::Attention) == doctest::Approx(3.5 * attnFwd).epsilon(1e-12));
  // Model FLOPs of the whole step: per micro-batch x micro-batches (512 on one GPU).
  CHECK(s1.modelFlopsPerStep == doctest::Approx(512 * (6 * matrices * tokens + 3.5 * attnFwd)).epsilon(1e-12));

  for (uint32_t tp : {2u, 4u, 8u}) {
    Workload w = llama8b(tp, 1, true);
    w.model.vocabPadMultiple = 1;  // the head unpadded: 128256 splits evenly (padding is tested in test_model_shape)
    const StepLowering s = lowerStep(w, resolveLayout(w, tp));
    CHECK(sumFlops(s.stages[0], ComputeKind::Gemm) * tp ==
          doctest::Approx(sumFlops(s1.stages[0], ComputeKind::Gemm)).epsilon(1e-12));
    CHECK(s.modelFlopsPerStep == doctest::Approx(s1.modelFlopsPerStep).epsilon(1e-12));
  }
  // Full recomputation adds one forward pass of work but no model FLOPs.
  Workload wr = llama8b(1, 1, false);
  wr.training.recompute = Recompute::Full;
  const StepLowering sr = lowerStep(wr, resolveLayout(wr, 1));
  double hw = 0;  // the matrix products' (the census's other kernels are checked in test_workload.cpp)
  for (const ComputeOp& op : sr.stages[0].compute)
    if (op.kind != ComputeKind::Other) hw += op.flops * op.times;
  // (the transformer layers are recomputed, not the LM head)
  CHECK(hw == doctest::Approx(sumFlops(s1.stages[0], ComputeKind::Gemm) + 3.5 * attnFwd +
                              2 * (matrices - 128256 * h) * tokens + attnFwd)
                  .epsilon(1e-12));
  CHECK(sr.modelFlopsPerStep == doctest::Approx(s1.modelFlopsPerStep).epsilon(1e-12));
}

TEST_CASE("lowering: tensor parallelism's collectives, with and without sequence parallelism") {
  const uint64_t tokens = 8192, h = 4096;
  {
    const Workload w = llama8b(8, 1, true);
    const StageLowering s = lowerStep(w, resolveLayout(w, 8)).stages[0];
    int ag = 0, rs = 0, ar = 0;
    for (const CommOp& c : s.comm) {
      if (c.phase != Phase::Tp) continue;
      if (c.kind == CommKind::AllGather) ++ag;
      if (c.kind == CommKind::ReduceScatter) ++rs;
      if (c.kind == CommKind::AllReduce) ++ar;
      if (c.name.find("lm-head") == std::string::npos) CHECK(c.times == 32);
      CHECK(c.count == tokens * h / 8);
      CHECK(c.timing == CommTiming::Blocking);
    }
    CHECK(ar == 0);
    CHECK(ag == 5);  // qkv, mlp-up forward; attn-out, mlp-down data gradients; the LM head's input
    CHECK(rs == 5);  // attn-out, mlp-down forward; qkv, mlp-up data gradients; the LM head's data gradient
    // Every TP collective is fused with the GEMM next to it, of the matching kind.
    CHECK(s.fused.size() == 10);
    for (const FusedCandidate& f : s.fused) {
      const CommOp& c = s.comm[f.comm];
      const ComputeOp& g = s.compute[f.compute];
      CHECK(g.kind == ComputeKind::Gemm);
      CHECK(c.name.find(g.name) != std::string::npos);
      CHECK((f.kind == FusedKind::AllGatherGemm) == (c.kind == CommKind::AllGather));
      CHECK((f.kind == FusedKind::GemmReduceScatter) == (c.kind == CommKind::ReduceScatter));
    }
  }
  {
    const Workload w = llama8b(8, 1, false);
    const StageLowering s = lowerStep(w, resolveLayout(w, 8)).stages[0];
    std::set<std::string> names;
    for (const CommOp& c : s.comm)
      if (c.phase == Phase::Tp) {
        CHECK(c.kind == CommKind::AllReduce);
        CHECK(c.count == tokens * h);
        names.insert(c.name);
      }
    CHECK(names == std::set<std::string>{"tp.ar.attn-out", "tp.ar.mlp-down", "tp.ar.qkv.dgrad", "tp.ar.mlp-up.dgrad",
                                         "tp.ar.lm-head.dgrad"});
  }
  {
    const Workload w = llama8b(1, 1, true);
    const StageLowering s = lowerStep(w, resolveLayout(w, 8)).stages[0];
    for (const CommOp& c : s.comm) CHECK(c.phase != Phase::Tp);
    CHECK(s.fused.empty());
  }
}

TEST_CASE("lowering: rank groups partition each stage, tensor-parallel ranks are adjacent") {
  Workload w = workloadPreset("mixtral-8x22b");    // tp 2, pp 4, ep 8
  const ResolvedLayout r = resolveLayout(w, 256);  // dp 32
  const StepLowering step = lowerStep(w, r);
  REQUIRE(step.stages.size() == 4);
  for (const StageLowering& s : step.stages) {
    const uint32_t first = s.stage * 64;  // tp x dp ranks per stage
    for (const GroupSet& g : s.groups) {
      if (g.name == "pp") continue;
      std::vector<uint32_t> all;
      for (const auto& inst : g.instances) all.insert(all.end(), inst.begin(), inst.end());
      std::sort(all.begin(), all.end());
      REQUIRE(all.size() == 64);
      for (uint32_t i = 0; i < 64; ++i) CHECK(all[i] == first + i);
    }
    const GroupSet& tp = s.groups[0];
    CHECK(tp.name == "tp");
    CHECK(tp.instances[0] == std::vector<uint32_t>{first, first + 1});
    for (const GroupSet& g : s.groups) {
      if (g.name == "ep")
        CHECK(g.instances[0] == std::vector<uint32_t>{first, first + 2, first + 4, first + 6, first + 8, first + 10,
                                                      first + 12, first + 14});
      if (g.name == "dp") CHECK(g.instances[0].size() == 32);
      // Expert data parallelism: every rank holding experts 0 of 8, whole (etp 1): both TP ranks of dp 0, 8, 16, 24.
      if (g.name == "edp")
        CHECK(g.instances[0] == std::vector<uint32_t>{first, first + 1, first + 16, first + 17, first + 32, first + 33,
                                                      first + 48, first + 49});
      if (g.name == "pp") {
        CHECK(g.instances.size() == 64);
        const uint32_t from = s.stage + 1 < 4 ? s.stage : s.stage - 1;
        CHECK(g.instances[0] == std::vector<uint32_t>{from * 64, (from + 1) * 64});
      }
    }
  }
}

TEST_CASE("lowering: mixture of experts — dispatch and combine, expert GEMMs and parameters") {
  const Workload w = workloadPreset("mixtral-8x22b");  // 8 experts, top 2, tp 2, ep 8, seq 4096
  const StepLowering step = lowerStep(w, resolveLayout(w, 256));
  const StageLowering& s = step.stages[1];
  const uint64_t local = 4096 / 2, h = 6144;
  const CommOp* d = findComm(s, "ep.dispatch");
  REQUIRE(d);
  CHECK(d->kind == CommKind::AllToAll);
  CHECK(d->count == local * 2 * h / 8);  // per destination block
  CHECK(d->times == 14);                 // 56 layers over 4 stages
  CHECK(findComm(s, "ep.combine"));
  CHECK(findComm(s, "ep.combine.bwd"));
  CHECK(findComm(s, "ep.dispatch.bwd"));
  bool sawUp = false;
  for (const ComputeOp& op : s.compute)
    if (op.name == "expert-up") {
      sawUp = true;
      CHECK(op.batch == 1);              // 8 experts over 8 ranks
      CHECK(op.m == local * 2 * 8 / 8);  // every token of the EP group x top-k, spread over 8 experts
      CHECK(op.n == 2 * 16384);
    }
  CHECK(sawUp);
  CHECK(s.expertParams == doctest::Approx(14.0 * 1 * 3 * 6144 * 16384));
  CHECK(findComm(s, "edp.rs"));  // expert gradients over the 4 ranks holding the same expert
  CHECK(findComm(s, "dp.rs"));
}

TEST_CASE("lowering: gradient buckets cover the parameters, ZeRO stages change the collectives") {
  Workload w = llama8b(8, 1, true);
  for (uint32_t zero : {0u, 1u, 2u, 3u}) {
    w.layout.zero = zero;
    const StageLowering s = lowerStep(w, resolveLayout(w, 64)).stages[0];  // dp 8
    if (zero == 0) {
      const CommOp* ar = findComm(s, "dp.ar");
      REQUIRE(ar);
      CHECK(ar->timing == CommTiming::GradBucket);
      const double elems = static_cast<double>(ar->count) * ar->times;
      CHECK(elems >= s.denseParams);
      CHECK(elems < s.denseParams + ar->times);
      CHECK(static_cast<double>(ar->count) * 4 <= 25 * 1048576.0);  // fp32 gradients, 25 MiB buckets
    } else if (zero < 3) {
      const CommOp* rs = findComm(s, "dp.rs");
      const CommOp* ag = findComm(s, "dp.ag");
      REQUIRE(rs);
      REQUIRE(ag);
      CHECK(static_cast<double>(rs->count * 8 * rs->times) >= s.denseParams);
      CHECK(ag->timing == CommTiming::ParamGather);
      CHECK(ag->dtype == DType::BFloat16);
    } else {
      const CommOp* ag = findComm(s, "dp.layer.ag");
      REQUIRE(ag);
      CHECK(ag->timing == CommTiming::LayerPrefetch);
      CHECK(ag->times == 32);
      CHECK(findComm(s, "dp.layer.rs"));
    }
  }
  // One replica: nothing to reduce.
  const StageLowering one = lowerStep(w, resolveLayout(w, 8)).stages[0];
  for (const CommOp& c : one.comm) CHECK(c.phase != Phase::Dp);
}

TEST_CASE("lowering: pipeline sends per micro-batch and model chunk") {
  Workload w = workloadPreset("llama3-70b");
  w.layout.schedule = PipelineSchedule::Interleaved;
  w.layout.virtualStages = 5;
  const StepLowering step = lowerStep(w, resolveLayout(w, 64));
  const CommOp* send = findComm(step.stages[0], "pp.send");
  REQUIRE(send);
  CHECK(send->kind == CommKind::SendRecv);
  CHECK(send->times == 5);
  CHECK(send->count == 8192ull * 8192 / 8);
}

TEST_CASE("memory: model state under each ZeRO stage and activations in flight") {
  Workload w = llama8b(8, 1, true);
  w.layout.zero = 0;
  const StepLowering s0 = lowerStep(w, resolveLayout(w, 64));
  const MemoryEstimate m0 = estimateMemory(w, s0);
  const double p = s0.stages[0].denseParams;
  CHECK(m0.weights == doctest::Approx(2 * p));
  CHECK(m0.gradients == doctest::Approx(4 * p));
  CHECK(m0.optimizer == doctest::Approx(12 * p));
  // Per layer (memory.hpp), with sequence parallelism: 10 s b h / t on the slice; Q and O of 32 heads, K and V of 8
  // (5 s b h / t); the gated MLP's 2 x 14336 activation inputs and 14336 outputs (6 x 14336 s b / t). 32 layers, one
  // micro-batch in flight without pipelining.
  CHECK(m0.activations == doctest::Approx((15.0 * 4096 + 6 * 14336) * 8192 / 8 * 32));
  w.layout.zero = 2;
  const MemoryEstimate m2 = estimateMemory(w, lowerStep(w, resolveLayout(w, 64)));
  CHECK(m2.gradients == doctest::Approx(4 * p / 8));
  CHECK(m2.optimizer == doctest::Approx(12 * p / 8));
  CHECK(m2.weights == doctest::Approx(2 * p));
  // 1F1B: the first stage holds pp micro-batches, the most of any stage.
  const Workload w70 = workloadPreset("llama3-70b");
  const MemoryEstimate m70 = estimateMemory(w70, lowerStep(w70, resolveLayout(w70, 64)));
  CHECK(m70.inFlight == 4);
  CHECK(m70.stage == 0);
}

namespace {

/// 2 layers, hidden 64 in 4 heads of 16, gated FFN 256, one sequence of 32 tokens, tp 2 with sequence parallelism.
Workload tinyRecompute(Recompute mode, RecomputeModules modules) {
  Workload w = workloadPreset("llama3-8b");
  w.model.layers = 2;
  w.model.hidden = 64;
  w.model.ffn = 256;
  w.model.heads = 4;
  w.model.kvHeads = 4;
  w.model.vocab = 100;
  w.training.seq = 32;
  w.training.microBatch = 1;
  w.training.globalBatch = 1;
  w.training.recompute = mode;
  w.training.recomputeModules = modules;
  w.layout = ParallelLayout{};
  w.layout.tp = 2;
  return w;
}

/// FLOPs of the recomputed ops of stage 0 and their names.
double recomputedFlops(const StepLowering& s, std::set<std::string>& names) {
  double f = 0;
  for (const ComputeOp& op : s.stages[0].compute)
    if (op.recompute) {
      f += op.flops * op.times;
      names.insert(op.name);
    }
  for (const CommOp& c : s.stages[0].comm)
    if (c.name.find(".recompute") != std::string::npos) names.insert(c.name);
  return f;
}

}  // namespace

TEST_CASE("lowering: selective recompute re-runs the chosen modules' forward ops, memory drops by their bytes") {
  RecomputeModules mods;
  mods.coreAttn = mods.mlp = mods.norms = true;
  const Workload w = tinyRecompute(Recompute::Selective, mods);
  const StepLowering s = lowerStep(w, resolveLayout(w, 2));
  std::set<std::string> names;
  // Per layer on each of the 2 ranks (T = 32, f / t = 128, 2 heads of 16, the norms on T / t = 16 tokens):
  // attention 2 x 2 x 32^2 x 16 / 2 x 2 heads = 65536; mlp-up 2 x 32 x 256 x 64, mlp-down 2 x 32 x 64 x 128,
  // swiglu 5 x 32 x 128; two rmsnorms 5 x 16 x 64.
  const double perLayer = 65536 + 2.0 * 32 * 256 * 64 + 2.0 * 32 * 64 * 128 + 5.0 * 32 * 128 + 2 * 5.0 * 16 * 64;
  CHECK(recomputedFlops(s, names) == doctest::Approx(2 * perLayer).epsilon(1e-12));
  CHECK(names == std::set<std::string>{"attention.recompute", "mlp-up.recompute", "mlp-act.recompute",
                                       "mlp-down.recompute", "attn-norm.recompute", "mlp-norm.recompute",
                                       "tp.ag.mlp-up.recompute", "tp.rs.mlp-down.recompute"});
  CHECK(s.modelFlopsPerStep ==
        doctest::Approx(lowerStep(tinyRecompute(Recompute::None, {}), resolveLayout(w, 2)).modelFlopsPerStep)
            .epsilon(1e-12));
  // Memory per layer: 42 s b h / t kept without recomputation (the paper's 34 with a gated MLP of 4h: 2 x 4h
  // activation inputs); mlp drops the activation's input and output, 24 s b h / t, norms 4 s b h / t, core_attn
  // nothing (its scores are never stored).
  const double sbh = 32.0 * 64;
  const Workload none = tinyRecompute(Recompute::None, {});
  CHECK(estimateMemory(none, lowerStep(none, resolveLayout(none, 2))).activations == doctest::Approx(2 * 42 * sbh / 2));
  CHECK(estimateMemory(w, s).activations == doctest::Approx(2 * (42 - 24 - 4) * sbh / 2));
  RecomputeModules attn;
  attn.coreAttn = true;
  const Workload a = tinyRecompute(Recompute::Selective, attn);
  CHECK(estimateMemory(a, lowerStep(a, resolveLayout(a, 2))).activations == doctest::Approx(2 * 42 * sbh / 2));

  // moe_act on a mixture of experts: only the experts' activation runs again; each rank's 16 tokens reach 2 experts
  // of 4h columns, whose 2-byte outputs are not kept: 16 x 2 x 256 x 2 = 16 s b h / t fewer bytes a layer.
  RecomputeModules act;
  act.moeAct = true;
  Workload moe = tinyRecompute(Recompute::Selective, act);
  moe.model.moe = MoeSpec{4, 2, 0};
  Workload moeNone = moe;
  moeNone.training.recompute = Recompute::None;
  moeNone.training.recomputeModules = {};
  const StepLowering sm = lowerStep(moe, resolveLayout(moe, 2));
  names.clear();
  const double f = recomputedFlops(sm, names);
  CHECK(names == std::set<std::string>{"expert-act.recompute"});
  const ComputeOp* fwd = nullptr;
  for (const ComputeOp& op : sm.stages[0].compute)
    if (op.name == "expert-act") fwd = &op;
  REQUIRE(fwd);
  CHECK(f == doctest::Approx(fwd->flops * fwd->times));
  CHECK(estimateMemory(moeNone, lowerStep(moeNone, resolveLayout(moe, 2))).activations -
            estimateMemory(moe, sm).activations ==
        doctest::Approx(2 * 16 * sbh / 2));
}

TEST_CASE("lowering: ZeRO 3 with pipeline stages gathers each stage's layers per micro-batch, memory by hand") {
  Workload w = llama8b(1, 4, true);
  w.layout.zero = 3;
  validateWorkload(w);  // FSDP with pipeline parallelism is a layout, not an error
  const StepLowering step = lowerStep(w, resolveLayout(w, 32));  // dp 8
  const double h = 4096, vocabRows = 128256 * h;
  const double layer = h * (4096 + 2 * 1024) + h * h + 2 * h + 3 * h * 14336;
  for (const StageLowering& s : step.stages) {
    const CommOp* ag = findComm(s, "dp.layer.ag");
    REQUIRE(ag);
    CHECK(ag->times == 8);  // the stage's layers, per micro-batch, forward and backward
    CHECK(ag->count == static_cast<uint64_t>(std::ceil(layer / 8)));
    CHECK(ag->timing == CommTiming::LayerPrefetch);
    CHECK(findComm(s, "dp.layer.ag.bwd")->times == 8);
    CHECK(findComm(s, "dp.layer.rs")->times == 8);
    CHECK((findComm(s, "dp.embedding.ag") != nullptr) == (s.embedding || s.head));
    for (const GroupSet& g : s.groups)
      if (g.name == "dp")
        for (const auto& inst : g.instances)
          for (uint32_t rank : inst) CHECK(rank / 8 == s.stage);  // the stage's own replicas
  }
  CHECK(findComm(step.stages[0], "dp.embedding.ag")->count == static_cast<uint64_t>(std::ceil(vocabRows / 8)));
  // Stage 0: 8 layers and the embedding, sharded over 8; the embedding is the largest unit, held twice while
  // gathered (current and prefetched) and once as a whole gradient.
  const MemoryEstimate m = estimateMemory(w, step);
  const StageLowering& s0 = step.stages[m.stage];
  const double dense = s0.denseParams;
  CHECK(s0.gatheredParams ==
        doctest::Approx(std::max(layer, (s0.embedding ? vocabRows : 0) + (s0.head ? vocabRows + h : 0))));
  CHECK(m.weights == doctest::Approx(2 * dense / 8 + 2 * 2 * s0.gatheredParams));
  CHECK(m.gradients == doctest::Approx(4 * dense / 8 + 4 * s0.gatheredParams));
  CHECK(m.optimizer == doctest::Approx(12 * dense / 8));
  CHECK(step.stages[0].gatheredParams == doctest::Approx(vocabRows));
  CHECK(step.stages[1].gatheredParams == doctest::Approx(layer));
}

// Tests of the model shapes of issue 34: parameter counts of public models against their configs, the lowering of
// MLA, sliding-window attention, shared experts and MoE layer layouts, vocabulary padding, tied embeddings, the
// activations, and their JSON fields.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "expect_error.hpp"
#include "mk/error.hpp"
#include "mk/workload/lowering.hpp"
#include "mk/workload/memory.hpp"
#include "mk/workload/model_shape.hpp"
#include "mk/workload/workload.hpp"

using namespace mk;
using mk::test::expectError;

namespace {

const ComputeOp* findOp(const StageLowering& s, const std::string& name) {
  for (const ComputeOp& op : s.compute)
    if (op.name == name) return &op;
  return nullptr;
}

double forwardGemmFlops(const StageLowering& s) {
  double f = 0;
  for (const ComputeOp& op : s.compute)
    if (op.kind == ComputeKind::Gemm && op.pass == Pass::Forward && !op.recompute) f += op.flops * op.times;
  return f;
}

/// One stage on `tp` GPUs of a small dense model: hidden 64, 4 heads, FFN 32, vocabulary 128, one sequence of 32.
Workload small(uint32_t layers, uint32_t tp) {
  Workload w = workloadPreset("llama3.1-8b");
  w.name = "small";
  w.model.layers = layers;
  w.model.hidden = 64;
  w.model.ffn = 32;
  w.model.heads = 4;
  w.model.kvHeads = 4;
  w.model.vocab = 128;
  w.training.seq = 32;
  w.training.microBatch = 1;
  w.training.globalBatch = 1;
  w.layout = ParallelLayout{};
  w.layout.tp = tp;
  w.layout.zero = 0;
  return w;
}

StageLowering lowerOne(const Workload& w) { return lowerStep(w, resolveLayout(w, w.layout.tp)).stages.at(0); }

}  // namespace

TEST_CASE("model shape: parameter counts of Llama 3.1, GPT-3 and DeepSeek-V3 from their configs") {
  // Llama 3.1 (config.json): GQA with 8 KV heads of 128, SwiGLU, untied embeddings of 128256, two norms a layer.
  auto llama = [](double L, double h, double f, double heads) {
    const double attn = h * (heads + 16) * 128 + heads * 128 * h;
    return L * (attn + 3 * h * f + 2 * h) + 2 * 128256 * h + h;
  };
  CHECK(countParams(workloadPreset("llama3.1-8b").model).total == llama(32, 4096, 14336, 32));
  CHECK(countParams(workloadPreset("llama3.1-8b").model).total == 8030261248.0);  // the published count
  CHECK(countParams(workloadPreset("llama3.1-70b").model).total == llama(80, 8192, 28672, 64));
  CHECK(countParams(workloadPreset("llama3.1-405b").model).total == llama(126, 16384, 53248, 128));
  CHECK(countParams(workloadPreset("llama3.1-405b").model).total / 1e9 == doctest::Approx(405.85).epsilon(1e-4));
  // GPT-3 175B: 12 h^2 a layer (attention 4 h^2, GELU MLP 2 x 4 h^2), tied embedding; biases and the learned
  // position embedding are not counted.
  const double g = 12288;
  const ParamCount gpt3 = countParams(workloadPreset("gpt3-175b").model);
  CHECK(gpt3.total == 96 * (12 * g * g + 2 * g) + 50257 * g + g);
  CHECK(gpt3.total / 1e9 == doctest::Approx(175).epsilon(0.003));

  // DeepSeek-V3 (config.json; the MTP module excluded): MLA q 7168 -> 1536 -> 128 x 192, kv 7168 -> 512 + 64,
  // 512 -> 128 x (128 + 128), o 128 x 128 -> 7168, latent norms; 3 dense layers of FFN 18432; 58 MoE layers of 256
  // experts of 2048 (top 8), one shared expert of 2048 and a 256 x 7168 router; vocabulary 129280, untied.
  const double h = 7168;
  const double attn = h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h + 1536 + 512;
  const double expert = 3 * h * 2048, base = attn + 2 * h;
  const double dense = 3 * (base + 3 * h * 18432), head = 2 * 129280 * h + h;
  const ParamCount ds = countParams(workloadPreset("deepseek-v3").model);
  CHECK(ds.total == dense + 58 * (base + 256 * expert + expert + 256 * h) + head);
  CHECK(ds.active == dense + 58 * (base + 8 * expert + expert + 256 * h) + head);
  CHECK(ds.total / 1e9 == doctest::Approx(671).epsilon(0.001));     // published: 671B total
  CHECK(ds.active / 1e9 == doctest::Approx(37.55).epsilon(0.001));  // published: 37B activated

  // The lowering counts the same parameters: DeepSeek-V3 on one stage of one GPU.
  Workload w = workloadPreset("deepseek-v3");
  w.layout = ParallelLayout{};
  w.training.globalBatch = 1;
  w.training.seq = 16;
  const StageLowering st = lowerOne(w);
  CHECK(st.denseParams + st.expertParams == doctest::Approx(ds.total).epsilon(1e-12));
}

TEST_CASE("model shape: one MLA layer's GEMM and attention FLOPs match the hand formulas, split by TP") {
  for (uint32_t tp : {1u, 2u}) {
    Workload w = small(1, tp);
    w.model.mla = MlaSpec{16, 8, 8, 4, 6};  // q latent 16, kv latent 8, qk 8 + 4 (rope), v 6
    const StageLowering s = lowerOne(w);
    const double T = 32, h = 64, a = 4.0 / tp;
    // Replicated down-projections, head-split up-projections and output, the MLP, and the head over 128 rows of
    // the vocabulary (128 padded to a multiple of 128 x tp, split by tp).
    const double gemm =
        2 * T * (h * 16 + 16 * a * 12 + h * (8 + 4) + 8 * a * (8 + 6) + a * 6 * h + 3 * h * 32 / tp + 128 * h);
    CHECK(forwardGemmFlops(s) == doctest::Approx(gemm).epsilon(1e-12));
    // Causal attention: QK^T over 12 dims and PV over 6 for s / 2 keys per query, a heads of the rank.
    const ComputeOp* attn = findOp(s, "attention");
    REQUIRE(attn);
    CHECK(attn->flops == doctest::Approx(2 * (12 + 6) * T * (T / 2) * a).epsilon(1e-12));
    CHECK(findOp(s, "attention.bwd")->flops == doctest::Approx(2.5 * attn->flops).epsilon(1e-12));
    CHECK(findOp(s, "q-down")->n == 16);
    CHECK(findOp(s, "kv-up")->n == static_cast<uint64_t>(a * 14));
    CHECK(findOp(s, "rope")->headDim == 4);
    if (tp == 2) REQUIRE(findOp(s, "q-down.dgrad"));
  }
  // Without a query latent the queries are projected directly.
  Workload w = small(1, 1);
  w.model.mla = MlaSpec{0, 8, 8, 4, 6};
  const StageLowering s = lowerOne(w);
  CHECK(findOp(s, "q-down") == nullptr);
  REQUIRE(findOp(s, "q"));
  CHECK(findOp(s, "q")->n == 4 * 12);
}

TEST_CASE("model shape: a sliding-window layer's attention sees min(seq, window) keys per query") {
  Workload w = small(2, 1);
  w.training.seq = 4096;
  w.model.hidden = 32;
  w.model.explicitHeadDim = 16;  // not hidden / heads = 8
  w.model.slidingWindow = 128;
  w.model.slidingPattern = {1, 0};  // layer 0 windowed, layer 1 full
  const StageLowering s = lowerOne(w);
  const ComputeOp* swa = findOp(s, "attention-swa");
  const ComputeOp* full = findOp(s, "attention");
  REQUIRE(swa);
  REQUIRE(full);
  CHECK(swa->times == 1);
  CHECK(full->times == 1);
  // Causal with a window of 128: query i sees min(i + 1, 128) keys, s w - w^2 / 2 = 516096 in all (continuous).
  const double keys = 4096.0 * 128 - 128.0 * 128 / 2;
  CHECK(swa->flops == 4.0 * 16 * keys * 4);
  CHECK(full->flops == 4.0 * 16 * (4096.0 * 4096 / 2) * 4);
  CHECK(findOp(s, "attention-swa.bwd")->flops == 2.5 * swa->flops);
  CHECK(findOp(s, "qkv")->n == (4 + 2 * 4) * 16);
  CHECK(findOp(s, "attn-out")->k == 4 * 16);
  // Every n-th layer full: n = 2 is the same pattern; no pattern windows every layer.
  CHECK(isWindowedLayer(w.model, 2));
  CHECK_FALSE(isWindowedLayer(w.model, 3));
  w.model.slidingPattern.clear();
  CHECK(findOp(lowerOne(w), "attention") == nullptr);
}

TEST_CASE("model shape: first dense layers, MoE frequency and shared experts follow the global layer index") {
  Workload w = small(6, 1);
  MoeSpec moe{4, 2, 16};
  moe.firstDenseLayers = 2;
  moe.layerFreq = 2;  // MoE layers: 2 and 4
  moe.sharedExperts = 2;
  moe.sharedFfn = 8;
  w.model.moe = moe;
  w.layout.pp = 2;
  w.training.globalBatch = 2;
  const StepLowering step = lowerStep(w, resolveLayout(w, 2));
  // Stage 0 holds layers 0-2 (one MoE), stage 1 layers 3-5 (one MoE).
  for (const StageLowering& s : step.stages) {
    CHECK(findOp(s, "mlp-up")->times == 2);
    CHECK(findOp(s, "expert-up")->times == 1);
    CHECK(findOp(s, "shared-up")->times == 1);
    CHECK(findOp(s, "shared-up")->n == 2 * 2 * 8);  // gate and up of 2 shared experts of 8
  }
  const LayerParams lp = layerParams(w.model, 1);
  CHECK(lp.shared == 3.0 * 64 * 16);
  const double layersDense = 2 * (lp.attention + lp.norms + lp.mlp);
  const double layerMoe = lp.attention + lp.norms + lp.shared + lp.router;
  CHECK(step.stages[1].denseParams == layersDense + layerMoe + 128 * 64 + 64);
  CHECK(step.stages[1].expertParams == 4 * lp.expert);
  CHECK(countParams(w.model).total ==
        4 * (lp.attention + lp.norms + lp.mlp) + 2 * (layerMoe + 4 * lp.expert) + 2 * 128 * 64 + 64);
}

TEST_CASE("model shape: the vocabulary is padded as Megatron-LM pads it, tied embeddings count once") {
  const Workload g = workloadPreset("gpt3-175b");
  CHECK(paddedVocab(g.model, 1) == 50304);
  CHECK(paddedVocab(g.model, 8) == 51200);  // ceil(50257 / 1024) x 1024
  Workload w = small(1, 2);
  w.model.vocab = 1001;  // 2 x 128 = 256: padded to 1024, 512 a rank
  const StageLowering s = lowerOne(w);
  CHECK(findOp(s, "lm-head")->n == 512);
  CHECK(findOp(s, "loss")->vocab == 512);
  CHECK(findOp(s, "embedding")->vocab == 512);
  Workload tied = w;
  tied.model.tiedEmbeddings = true;
  CHECK(lowerOne(w).denseParams - lowerOne(tied).denseParams == 512.0 * 64);
  CHECK(findOp(lowerOne(tied), "lm-head"));  // the head GEMMs still run
  CHECK(countParams(w.model).total - countParams(tied.model).total == 1001.0 * 64);
}

TEST_CASE("model shape: non-gated activations have two MLP matrices and their own kernel") {
  Workload w = small(1, 1);
  w.model.activation = Activation::SquaredRelu;
  const StageLowering s = lowerOne(w);
  CHECK(findOp(s, "mlp-up")->n == 32);
  CHECK(findOp(s, "mlp-act")->kernel == "squared-relu");
  CHECK(findOp(s, "attn-norm")->kernel == "layernorm");
  CHECK(layerParams(w.model, 1).mlp == 2.0 * 64 * 32);
  // One sequence of 32 tokens, bf16: squared ReLU reads and writes T x f, 2 FLOPs an element (3 backward).
  CHECK(findOp(s, "mlp-act")->bytes == 2.0 * 2 * 32 * 32);
  CHECK(findOp(s, "mlp-act")->flops == 2.0 * 32 * 32);
  CHECK(findOp(s, "mlp-act.bwd")->flops == 3.0 * 32 * 32);
  w.model.activation = Activation::GeGlu;
  const StageLowering g = lowerOne(w);
  CHECK(findOp(g, "mlp-up")->n == 64);
  // GeGLU is gated: gate and up (2f) read, f written, as SwiGLU; gelu on the gate and the product: 9 FLOPs.
  CHECK(findOp(g, "mlp-act")->bytes == 2.0 * 32 * 64 + 2.0 * 32 * 32);
  CHECK(findOp(g, "mlp-act")->flops == 9.0 * 32 * 32);
}

TEST_CASE("model shape: JSON fields round-trip, the old gatedMlp is read, bad fields are named") {
  for (const char* name : {"deepseek-v3", "gpt-oss-120b", "gpt3-175b", "qwen3-235b-a22b"}) {
    const std::string j = workloadToJson(workloadPreset(name));
    CHECK(workloadToJson(workloadFromJson(j)) == j);
  }
  const Workload old = workloadFromJson(R"({"preset": "llama3.1-8b", "model": {"gatedMlp": false}})");
  CHECK(old.model.activation == Activation::Gelu);
  const Workload sw = workloadFromJson(
      R"({"preset": "llama3.1-8b", "model": {"slidingWindow": 4096, "slidingWindowPattern": 6, "headDim": 64}})");
  CHECK(sw.model.slidingPattern == std::vector<uint8_t>{1, 1, 1, 1, 1, 0});
  CHECK(sw.model.headDim() == 64);
  const Workload list = workloadFromJson(
      R"({"preset": "llama3.1-8b", "model": {"slidingWindow": 4096, "slidingWindowPattern": ["sliding", "full", "full"]}})");
  CHECK(list.model.slidingPattern == std::vector<uint8_t>{1, 0, 0});
  // A dump without an explicit head dim keeps none: an edited hidden size then gives hidden / heads.
  Workload edited = workloadFromJson(workloadToJson(workloadPreset("llama3.1-8b")));
  CHECK(edited.model.explicitHeadDim == 0);
  auto bad = [](const std::string& model, ErrorCode code, const std::vector<std::string>& parts) {
    expectError([&] { workloadFromJson(R"({"preset": "deepseek-v3", "model": )" + model + "}"); }, code, parts);
  };
  bad(R"({"mla": {"kvLoraRank": 0}})", ErrorCode::InvalidArgument, {"model.mla.kvLoraRank must be > 0"});
  bad(R"({"moe": {"layerFreq": 0}})", ErrorCode::InvalidArgument, {"model.moe.layerFreq must be >= 1"});
  bad(R"({"activation": "relu"})", ErrorCode::ParseError, {"model.activation", "swiglu", "squared-relu", "relu"});
  bad(R"({"kvHeads": 8})", ErrorCode::InvalidArgument, {"model.kvHeads 8 conflicts with model.mla"});
  bad(R"({"headDim": 128})", ErrorCode::InvalidArgument, {"model.headDim 128 conflicts with model.mla"});
  bad(R"({"slidingWindowPattern": [1]})", ErrorCode::ParseError, {"model.slidingWindowPattern"});
  bad(R"({"slidingWindowPattern": 2})", ErrorCode::InvalidArgument, {"model.slidingWindowPattern needs"});
  bad(R"({"vocabPadMultiple": 0})", ErrorCode::InvalidArgument, {"model.vocabPadMultiple must be >= 1"});
  bad(R"({"moe": {"firstDenseLayers": 61}})", ErrorCode::InvalidArgument, {"model.moe.firstDenseLayers 61"});
  bad(R"({"moe": {"sharedExperts": 0, "sharedFfn": 64}})", ErrorCode::InvalidArgument, {"model.moe.sharedFfn 64"});
  // Sizes whose sums or products would wrap 64 bits are refused by name, not wrapped into small shapes.
  bad(R"({"mla": {"kvLoraRank": 18446744073709551615}})", ErrorCode::InvalidArgument,
      {"model.mla.kvLoraRank must be at most 4294967296"});
  bad(R"({"moe": {"sharedExperts": 4294967295, "sharedFfn": 4294967296}})", ErrorCode::InvalidArgument,
      {"model.moe.sharedExperts x model.moe.sharedFfn must be at most"});
}

// Activation memory of the shapes above (memory.hpp), each term against hand-computed bytes: small(layers, 2) has
// 32 tokens per rank, 16 in the sequence-parallel slice, hidden 64, and keeps per token of the slice the two norm
// inputs, the two norm outputs and two dropout masks, 2 x (2 + 2 + 1) x 64 = 640 bytes.

TEST_CASE("memory: heads x headDim, key-value heads and a non-gated MLP set a dense layer's activations") {
  Workload w = small(1, 2);
  w.model.explicitHeadDim = 32;  // heads x headDim = 128, twice hidden
  w.model.kvHeads = 2;
  w.model.activation = Activation::Gelu;
  const ResolvedLayout r = resolveLayout(w, 2);
  // Per rank: 2 query heads and 1 key-value head of 32: Q 64, K 32, V 32 (2 bytes), the attention output 64;
  // the MLP's 16 columns: the activation's input 16 (one FFN input, not gated) and output 16.
  const double attention = 32 * (2 * (64 + 32 + 32) + 2 * 64.0), mlp = 32 * (2 * 16 + 2 * 16.0);
  CHECK(layerActivations(w, r).dense == doctest::Approx(16 * 640 + attention + mlp));
  CHECK(estimateMemory(w, lowerStep(w, r)).activations == doctest::Approx(16 * 640 + attention + mlp));
  // Gated: gate and up, twice the activation's input.
  Workload gated = w;
  gated.model.activation = Activation::SwiGlu;
  CHECK(layerActivations(gated, r).dense - layerActivations(w, r).dense == doctest::Approx(32 * 2 * 16.0));
  // Without sequence parallelism the slice's 640 bytes a token are replicated over the 32 tokens.
  Workload noSp = w;
  noSp.layout.sp = false;
  CHECK(layerActivations(noSp, r).dense == doctest::Approx(32 * 640 + attention + mlp));
  // The paper's shape (4 heads of 16, ffn 4h, not gated) is 34 s b h / t.
  Workload paper = small(1, 2);
  paper.model.ffn = 256;
  paper.model.activation = Activation::Gelu;
  CHECK(layerActivations(paper, r).dense == doctest::Approx(34.0 * 32 * 64 / 2));
}

TEST_CASE("memory: MLA keeps per-head keys and values and its latents, a sliding window changes nothing") {
  Workload w = small(1, 2);
  w.model.mla = MlaSpec{16, 8, 8, 4, 8};  // q latent 16, kv latent 8, nope 8, rope 4, v 8
  validateWorkload(w);
  const ResolvedLayout r = resolveLayout(w, 2);
  // Per rank: 2 heads, Q and K of 8 + 4, V of 8 (2 bytes), the output 2 x 8; the latents 16 + 8 on every token,
  // each its norm's input (2 bytes) and output (2). The gated MLP's 16 columns: 2 x 16 in, 16 out.
  const double attention = 32 * (2 * (24 + 24 + 16) + 2 * 16.0 + 4 * 24.0), mlp = 32 * (2 * 32 + 2 * 16.0);
  CHECK(layerActivations(w, r).dense == doctest::Approx(16 * 640 + attention + mlp));
  // FlashAttention keeps Q, K, V, O per layer whatever keys a query sees.
  Workload windowed = w;
  windowed.model.slidingWindow = 8;
  CHECK(layerActivations(windowed, r).dense == doctest::Approx(layerActivations(w, r).dense));
}

TEST_CASE("memory: a MoE layer keeps router scores, the busiest rank's routed rows and the shared experts'") {
  // 3 layers, the first dense; 4 experts of 16 columns, top 2, one shared expert; tp 2 x ep 2 (dp 2), and the
  // busiest rank gets 1.5 x the balanced share (imbalance 2 capped by capacity 1.5).
  Workload w = small(3, 2);
  w.model.moe = MoeSpec{4, 2, 16};
  w.model.moe->sharedExperts = 1;
  w.model.moe->firstDenseLayers = 1;
  w.model.moe->imbalance = 2;
  w.model.moe->capacityFactor = 1.5;
  w.layout.ep = 2;
  w.training.globalBatch = 2;
  validateWorkload(w);
  const ResolvedLayout r = resolveLayout(w, 4);
  const double attention = 32 * (2 * (32 + 32 + 32) + 2 * 32.0);  // 2 heads of 16, Q K V O
  const double dense = 16 * 640 + attention + 32 * (2 * 32 + 2 * 16.0);
  // Each rank routes its 16 tokens: fp32 scores over 4 experts; 16 x 2 x 1.5 = 48 rows reach its experts, each
  // keeping the expert-up input (64), the activation's input (2 x 16) and output (16); the 16 x 2 rows the combine
  // returns (64); the shared expert's 8 columns per rank on all 32 tokens (2 x 8 in, 8 out).
  const double router = 16 * 4 * 4.0, rows = 48, expert = rows * 2 * (64 + 32 + 16.0);
  const double combine = 16 * 2 * 2 * 64.0, shared = 32 * 2 * (16 + 8.0);
  const double moe = 16 * 640 + attention + router + expert + combine + shared;
  const LayerActivations a = layerActivations(w, r);
  CHECK(a.dense == doctest::Approx(dense));
  CHECK(a.moe == doctest::Approx(moe));
  const StepLowering step = lowerStep(w, r);
  REQUIRE(step.stages[0].moeLayers == 2);
  CHECK(estimateMemory(w, step).activations == doctest::Approx(dense + 2 * moe));
  // Selective recomputation: moe_act drops the routed rows' activation outputs, norms both norm outputs of every
  // layer (2 x 64 x 2 bytes on the 16-token slice), mlp the dense layer's activation.
  Workload sel = w;
  sel.training.recompute = Recompute::Selective;
  sel.training.recomputeModules.moeAct = sel.training.recomputeModules.norms = sel.training.recomputeModules.mlp = true;
  const LayerActivations s = layerActivations(sel, r);
  CHECK(a.moe - s.moe == doctest::Approx(rows * 2 * 16 + 16 * 256.0));
  CHECK(a.dense - s.dense == doctest::Approx(32 * (2 * 32 + 2 * 16.0) + 16 * 256.0));
  // Full recomputation keeps each layer's input on the slice.
  sel.training.recompute = Recompute::Full;
  CHECK(layerActivations(sel, r).moe == doctest::Approx(16 * 2 * 64.0));
}

TEST_CASE("lowering: the router is no linear layer, so its weight gradient skips gradient-accumulation fusion") {
  Workload w = small(1, 1);
  w.model.moe = MoeSpec{4, 2, 16};
  w.training.recompute = Recompute::Full;
  const StageLowering s = lowerOne(w);
  for (const char* name : {"router", "router.dgrad", "router.wgrad", "router.recompute"}) {
    const ComputeOp* op = findOp(s, name);
    REQUIRE_MESSAGE(op, name);
    CHECK_MESSAGE(!op->linearLayer, name);
  }
  // The router's weight gradient (64 x 4 from 32 tokens) writes a 16-bit gradient; the experts' add into fp32.
  const ComputeOp* router = findOp(s, "router.wgrad");
  CHECK(!router->accumulateFp32);
  CHECK(router->bytes == doctest::Approx(2.0 * (64 * 32 + 32 * 4) + 2.0 * 64 * 4));
  for (const char* name : {"expert-up.wgrad", "qkv.wgrad", "attn-out.wgrad"}) {
    const ComputeOp* op = findOp(s, name);
    REQUIRE_MESSAGE(op, name);
    CHECK_MESSAGE(op->linearLayer, name);
    CHECK_MESSAGE(op->accumulateFp32, name);
  }
}

// Tests of workloads: presets, checks naming the field, JSON round trip and overrides, resolving a layout.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "mk/error.hpp"
#include "mk/workload/lowering.hpp"
#include "mk/workload/memory.hpp"
#include "mk/workload/workload.hpp"

using namespace mk;
using mk::test::expectError;

namespace {

Workload withLayout(const std::string& preset, const std::function<void(Workload&)>& edit) {
  Workload w = workloadPreset(preset);
  edit(w);
  return w;
}

/// The first kernel named `name` on stage `s`, or null.
const ComputeOp* findKernel(const StageLowering& s, const std::string& name) {
  for (const ComputeOp& op : s.compute)
    if (op.name == name) return &op;
  return nullptr;
}

/// The classes (contract names) of stage `s`'s kernels.
std::set<std::string> classesOf(const StageLowering& s) {
  std::set<std::string> out;
  for (const ComputeOp& op : s.compute) out.insert(toString(op.cls));
  return out;
}

/// A small model of odd sizes: hidden 96 in 3 heads of 32 (1 key-value head), FFN 192, vocabulary 1001, 2 layers;
/// micro-batches of 3 sequences of 17 tokens (T = 51).
Workload oddWorkload(uint32_t tp, bool sp) {
  Workload w = workloadPreset("llama3-8b");
  w.name = "odd";
  w.model.layers = 2;
  w.model.hidden = 96;
  w.model.ffn = 192;
  w.model.heads = 3;
  w.model.kvHeads = 1;
  w.model.vocab = 1001;
  w.model.vocabPadMultiple = 1;  // the hand formulas below use the vocabulary as given
  w.training.seq = 17;
  w.training.microBatch = 3;
  w.training.globalBatch = 6;
  w.training.recompute = Recompute::None;
  w.layout = ParallelLayout{};
  w.layout.tp = tp;
  w.layout.sp = sp;
  w.layout.zero = 0;
  return w;
}

}  // namespace

TEST_CASE("workload: every preset is valid, sourced and has the public config's shape") {
  CHECK(workloadPresets() == std::vector<std::string>{"gpt3-175b", "nemotron4-15b", "nemotron4-340b", "llama3.1-8b",
                                                      "llama3.1-70b", "llama3.1-405b", "llama3-8b", "llama3-70b",
                                                      "llama3-405b", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3",
                                                      "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b"});
  for (const auto& name : workloadPresets()) {
    const Workload w = workloadPreset(name);
    CHECK(w.name == name);
    const std::string src = workloadPresetSource(name);
    CHECK((src.find("huggingface.co/") != std::string::npos || src.find("arXiv") != std::string::npos ||
           src.find("alias of") != std::string::npos));
    CHECK_NOTHROW(validateWorkload(w));
  }
  const Workload l70 = workloadPreset("llama3-70b");
  CHECK(l70.model.layers == 80);
  CHECK(l70.model.hidden == 8192);
  CHECK(l70.model.ffn == 28672);
  CHECK(l70.model.heads == 64);
  CHECK(l70.model.kvHeads == 8);
  CHECK(l70.model.vocab == 128256);
  const Workload mx = workloadPreset("mixtral-8x22b");
  REQUIRE(mx.model.moe);
  CHECK(mx.model.moe->experts == 8);
  CHECK(mx.model.moe->topK == 2);
  CHECK(mx.model.layers == 56);
  expectError([] { workloadPreset("llama2"); }, ErrorCode::NotFound, {"llama2", "llama3-8b", "mixtral-8x22b"});
}

TEST_CASE("workload: inconsistent shapes and layouts are refused, naming the field") {
  auto check = [](const std::function<void(Workload&)>& edit, const std::vector<std::string>& parts) {
    expectError([&] { validateWorkload(withLayout("llama3-70b", edit)); }, ErrorCode::InvalidArgument, parts);
  };
  check([](Workload& w) { w.layout.tp = 3; }, {"layout.tp 3", "model.heads 64"});
  check([](Workload& w) { w.layout.tp = 0; }, {"layout.tp must be >= 1"});
  check([](Workload& w) { w.model.kvHeads = 5; }, {"model.kvHeads 5", "model.heads 64"});
  check([](Workload& w) { w.model.hidden = 8190; }, {"model.heads 64 does not divide model.hidden 8190"});
  check([](Workload& w) { w.layout.ep = 2; }, {"layout.ep 2", "model.moe"});
  check([](Workload& w) { w.layout.zero = 4; }, {"layout.zero must be 0, 1, 2 or 3"});
  check([](Workload& w) { w.layout.virtualStages = 2; }, {"layout.virtualStages must be 1", "interleaved"});
  check([](Workload& w) { w.layout.pp = 81; }, {"layout.pp 81 exceeds model.layers 80"});
  check([](Workload& w) { w.training.microBatch = 3; }, {"training.microBatch 3", "training.globalBatch 512"});
  check([](Workload& w) { w.training.dtype = DType::Float32; }, {"training.dtype must be bfloat16 or float16"});
  check(
      [](Workload& w) {
        w.layout.tp = 1;
        w.layout.dp = 3;
        w.layout.ep = 1;
        w.model.moe = MoeSpec{4, 1, 0};
        w.layout.ep = 2;
      },
      {"layout.ep 2 divides neither layout.dp x layout.cp 3 nor layout.tp x layout.cp x layout.dp / layout.etp 3"});
  expectError([] { validateWorkload(withLayout("mixtral-8x22b", [](Workload& w) { w.layout.sp = false; })); },
              ErrorCode::InvalidArgument, {"layout.sp must be true", "mixture-of-experts"});
  expectError([] { validateWorkload(withLayout("mixtral-8x22b", [](Workload& w) { w.layout.ep = 3; })); },
              ErrorCode::InvalidArgument, {"layout.ep 3 does not divide model.moe.experts 8"});
}

TEST_CASE("workload: JSON round trip, preset overrides, and parse errors naming the field") {
  for (const auto& name : workloadPresets()) {
    const Workload a = workloadPreset(name);
    const Workload b = workloadFromJson(workloadToJson(a));
    CHECK(workloadToJson(a) == workloadToJson(b));
  }
  const Workload o = workloadFromJson(
      R"({"preset": "llama3-70b", "name": "mine", "training": {"seq": 4096}, "layout": {"tp": 4, "dp": 16}})");
  CHECK(o.name == "mine");
  CHECK(o.training.seq == 4096);
  CHECK(o.training.globalBatch == 512);  // kept from the preset
  CHECK(o.layout.tp == 4);
  REQUIRE(o.layout.dp);
  CHECK(*o.layout.dp == 16);
  CHECK(o.model.hidden == 8192);

  auto bad = [](const std::string& text, ErrorCode code, const std::vector<std::string>& parts) {
    expectError([&] { workloadFromJson(text); }, code, parts);
  };
  bad("{", ErrorCode::ParseError, {"workload: not valid JSON"});
  bad(R"({"preset": "llama3-70b", "layout": {"tpp": 4}})", ErrorCode::ParseError, {"unknown field layout.tpp"});
  bad(R"({"preset": "llama3-70b", "layout": {"tp": -1}})", ErrorCode::ParseError,
      {"layout.tp must be a whole number in [0, 4294967295] (got number -1)"});
  bad(R"({"preset": "llama3-70b", "layout": {"dp": "many"}})", ErrorCode::ParseError,
      {"layout.dp must be a positive integer or \"auto\""});
  bad(R"({"preset": "llama3-70b", "layout": {"ppSchedule": "zb"}})", ErrorCode::ParseError, {"layout.ppSchedule"});
  bad(R"({"preset": "llama3-70b", "training": {"dtype": "int8"}})", ErrorCode::ParseError, {"training.dtype"});
  bad(R"({"preset": "llama3-70b", "training": {"dtype": "int32"}})", ErrorCode::ParseError, {"training.dtype"});
  bad(R"({"preset": "llama3-70b", "layout": {"tp": 5}})", ErrorCode::InvalidArgument, {"layout.tp 5"});
  bad(R"({"preset": "gpt5"})", ErrorCode::NotFound, {"unknown workload preset 'gpt5'"});
  bad(R"({"schema": "mkernel.workload.v1", "training": {"seq": 1, "microBatch": 1, "globalBatch": 1}})",
      ErrorCode::ParseError, {"missing field model"});
  bad(R"({"schema": "mkernel.workload.v1", "model": {"layers": 2, "hidden": 64, "ffn": 128, "heads": 4,
         "kvHeads": 4}, "training": {"seq": 1, "microBatch": 1, "globalBatch": 1}})",
      ErrorCode::ParseError, {"missing field model.vocab"});
  bad(R"({"model": {}})", ErrorCode::ParseError, {"missing field schema"});
}

TEST_CASE("workload: resolving a layout for a GPU count, with the field that does not fit named") {
  const Workload w = workloadPreset("llama3-70b");  // tp 8, pp 4, dp auto, global 512, micro 1
  const ResolvedLayout r = resolveLayout(w, 256);
  CHECK(r.dp == 8);
  CHECK(r.microBatches == 64);
  CHECK(r.stageLayers == std::vector<uint32_t>{20, 20, 20, 20});
  expectError([&] { resolveLayout(w, 48); }, ErrorCode::InvalidArgument,
              {"layout.tp x layout.pp = 32 does not divide 48 GPUs"});
  expectError([&] { resolveLayout(w, 32 * 1024); }, ErrorCode::InvalidArgument,
              {"training.globalBatch 512 is not a multiple of dp x microBatch = 1024"});
  Workload fixed = w;
  fixed.layout.dp = 4;
  CHECK(resolveLayout(fixed, 128).dp == 4);
  expectError([&] { resolveLayout(fixed, 256); }, ErrorCode::InvalidArgument,
              {"layout.dp 4 gives 128 GPUs", "not 256"});
  const ResolvedLayout big = resolveLayout(workloadPreset("llama3-405b"), 128 * 16);
  REQUIRE(big.stageLayers.size() == 16);
  CHECK(big.stageLayers.front() == 8);  // 126 = 14 x 8 + 2 x 7: the first stages take the extra layers
  CHECK(big.stageLayers.back() == 7);
  uint32_t sum = 0;
  for (uint32_t l : big.stageLayers) sum += l;
  CHECK(sum == 126);
}

TEST_CASE("workload: sizes whose products overflow 64 bits are refused naming the factors, never wrapped") {
  auto check = [](const std::function<void(Workload&)>& edit, const std::vector<std::string>& parts) {
    expectError([&] { validateWorkload(withLayout("llama3-8b", edit)); }, ErrorCode::InvalidArgument, parts);
  };
  // A hidden size of 2^62: tokens x hidden wrapped to 0 and surfaced as "count must be > 0 (got 0)".
  check([](Workload& w) { w.model.hidden = uint64_t{1} << 62; },
        {"training.microBatch x training.seq x model.hidden x bytes per element", "4611686018427387904",
         "overflows 64 bits"});
  // 2^30 sequences of 2^40 tokens: the tokens of a step wrapped to 64 and gave a wrong throughput with exit 0.
  check(
      [](Workload& w) {
        w.training.seq = uint64_t{1} << 40;
        w.training.globalBatch = uint64_t{1} << 30;
      },
      {"training.globalBatch x training.seq = 1073741824 x 1099511627776 overflows 64 bits"});
  check(
      [](Workload& w) {
        w.model.ffn = uint64_t{1} << 61;
        w.layout.tp = 1;
      },
      {"parameters", "overflows 64 bits"});
  // An expert model: the routed rows count topK copies of each token.
  expectError(
      [] { validateWorkload(withLayout("mixtral-8x22b", [](Workload& w) { w.model.hidden = uint64_t{3} << 58; })); },
      ErrorCode::InvalidArgument, {"model.hidden x model.moe.topK x bytes per element", "overflows 64 bits"});
}

TEST_CASE("workload: a gradient bucket outside [4 KiB, 1e6 MiB] is an error, never silently the default") {
  // 1e-9 MiB rounds to 0 bytes, which used to mean "the default 25 MiB".
  expectError([] { workloadFromJson(R"({"preset": "llama3-8b", "layout": {"bucketMiB": 1e-9}})"); },
              ErrorCode::ParseError, {"layout.bucketMiB must be in [0.00390625, 1e6] MiB", "1e-09"});
  expectError([] { workloadFromJson(R"({"preset": "llama3-8b", "layout": {"bucketMiB": 0.001}})"); },
              ErrorCode::ParseError, {"layout.bucketMiB"});
  CHECK(workloadFromJson(R"({"preset": "llama3-8b", "layout": {"bucketMiB": 0.00390625}})").layout.bucketBytes == 4096);
  CHECK(workloadPreset("llama3-8b").layout.bucketBytes == kDefaultBucketBytes);
  // A bucket of 0 bytes set in code (or by --bucket 0) is refused too: 0 no longer stands for the default.
  expectError([] { validateWorkload(withLayout("llama3-8b", [](Workload& w) { w.layout.bucketBytes = 0; })); },
              ErrorCode::InvalidArgument, {"layout.bucketMiB (--bucket) must be in [4 KiB, 1e6 MiB] (got 0 bytes)"});
}

TEST_CASE("workload: the census names every class of the contract where the step runs it, dense and MoE") {
  // Dense: Llama 3 8B on two pipeline stages; the embedding runs on the first, the final norm, LM head and loss
  // on the last; every stage runs its layers' norms, rotary, attention, activations and residual adds, and its
  // optimizer step and gradient norm once per step.
  Workload w = workloadPreset("llama3-8b");
  w.layout.tp = 2;
  w.layout.pp = 2;
  const StepLowering step = lowerStep(w, resolveLayout(w, 8));
  REQUIRE(step.stages.size() == 2);
  const std::set<std::string> layer{"gemm",   "attention", "norm",      "activation",
                                    "rotary", "residual",  "optimizer", "grad-norm"};
  for (const StageLowering& st : step.stages) {
    const std::set<std::string> have = classesOf(st);
    for (const std::string& c : layer) CHECK_MESSAGE(have.count(c), "stage ", st.stage, " lacks ", c);
    CHECK(have.count("router") == 0);
    CHECK(have.count("permute") == 0);
    CHECK(have.count("cast") == 0);  // FP8 recipes only (issue 32 item 4)
    CHECK(have.count("embedding") == (st.stage == 0 ? 1u : 0u));
    CHECK(have.count("loss") == (st.stage == 1 ? 1u : 0u));
    for (const ComputeOp& op : st.compute) {
      CHECK_MESSAGE(!op.kernel.empty(), op.name);
      CHECK_MESSAGE(op.bytes > 0, op.name);
      CHECK_MESSAGE(op.flops >= 0, op.name);
      CHECK_MESSAGE(op.times >= 1, op.name);
      CHECK((op.kind == ComputeKind::Other) == (op.cls != KernelClass::Gemm && op.cls != KernelClass::Attention));
      // Once per step: the optimizer's kernels, but the per-micro-batch gradient accumulation.
      const bool perStep =
          (op.cls == KernelClass::Optimizer && op.kernel != "grad-accum") || op.cls == KernelClass::GradNorm;
      CHECK_MESSAGE((op.pass == Pass::Step) == perStep, op.name);
    }
    // Every forward kernel of a class with a backward has its backward, as often.
    const ComputeOp* norm = findKernel(st, "attn-norm");
    const ComputeOp* normBwd = findKernel(st, "attn-norm.bwd");
    REQUIRE(norm);
    REQUIRE(normBwd);
    CHECK(normBwd->pass == Pass::Backward);
    CHECK(normBwd->times == norm->times);
    CHECK(findKernel(st, "adam")->times == 1);
  }
  CHECK(findKernel(step.stages[0], "embedding.bwd"));
  CHECK(findKernel(step.stages[1], "loss.bwd"));
  CHECK(findKernel(step.stages[1], "final-norm"));

  // MoE: Mixtral 8x22B adds the router's top-k softmax, the permutation and its inverse, on every stage.
  const Workload mx = workloadPreset("mixtral-8x22b");
  const StepLowering ms = lowerStep(mx, resolveLayout(mx, 256));
  for (const StageLowering& st : ms.stages) {
    const std::set<std::string> have = classesOf(st);
    for (const std::string& c : layer) CHECK_MESSAGE(have.count(c), "stage ", st.stage, " lacks ", c);
    CHECK(have.count("router"));
    CHECK(have.count("permute"));
    const ComputeOp* up = findKernel(st, "expert-up");
    const ComputeOp* act = findKernel(st, "expert-act");
    const ComputeOp* perm = findKernel(st, "permute");
    const ComputeOp* unperm = findKernel(st, "unpermute");
    REQUIRE(up);
    REQUIRE(act);
    REQUIRE(perm);
    REQUIRE(unperm);
    CHECK(act->tokens == up->m * up->batch);  // one launch over every local expert's rows
    CHECK(act->hidden == up->n);
    CHECK(perm->tokens == 4096 / 2);  // each tensor-parallel rank routes its sequence slice
    CHECK(perm->topk == 2);
    CHECK(unperm->kernel == "unpermute");
    CHECK(findKernel(st, "permute.bwd")->kernel == "unpermute");
    CHECK(findKernel(st, "router-topk")->experts == 8);
  }
  CHECK(classesOf(ms.stages.front()).count("embedding"));
  CHECK(classesOf(ms.stages.back()).count("loss"));
}

TEST_CASE("workload: census FLOPs and bytes of an odd-sized model match the hand formulas, sliced by tp and sp") {
  const Workload w = oddWorkload(1, false);
  const StepLowering step = lowerStep(w, resolveLayout(w, 1));
  const StageLowering& s = step.stages[0];
  const double T = 51, h = 96, e = 2;
  // RMSNorm: 5 T h FLOPs; x in and out, the weight, the fp32 rstd per token.
  const ComputeOp* norm = findKernel(s, "mlp-norm");
  REQUIRE(norm);
  CHECK(norm->kernel == "rmsnorm");
  CHECK(norm->tokens == 51);
  CHECK(norm->flops == 5 * T * h);
  CHECK(norm->bytes == 2 * e * T * h + e * h + 4 * T);
  CHECK(findKernel(s, "mlp-norm.bwd")->bytes == 3 * e * T * h + 2 * e * h + 4 * T);
  // SwiGLU: input gate + up (2 x 192), output 192.
  const ComputeOp* act = findKernel(s, "mlp-act");
  REQUIRE(act);
  CHECK(act->hidden == 384);
  CHECK(act->flops == 5 * T * 192);
  CHECK(act->bytes == e * T * 384 + e * T * 192);
  // Rotary on 3 q heads and 1 k head of 32, cos and sin per token.
  const ComputeOp* rope = findKernel(s, "rope");
  REQUIRE(rope);
  CHECK(rope->heads == 4);
  CHECK(rope->flops == 3 * T * 4 * 32);
  CHECK(rope->bytes == 2 * e * T * 4 * 32 + 2 * e * T * 32);
  // Residual add: two in, one out.
  CHECK(findKernel(s, "attn-residual")->bytes == 3 * e * T * h);
  // Cross-entropy over 1001 logits per token: int64 labels, fp32 loss and log-sum-exp.
  const ComputeOp* loss = findKernel(s, "loss");
  REQUIRE(loss);
  CHECK(loss->vocab == 1001);
  CHECK(loss->flops == 4 * T * 1001);
  CHECK(loss->bytes == e * T * 1001 + 16 * T);
  // Embedding: int64 ids, a row read and written per token; backward scatters into the whole table.
  CHECK(findKernel(s, "embedding")->bytes == 8 * T + 2 * e * T * h);
  CHECK(findKernel(s, "embedding.bwd")->bytes == 8 * T + e * T * h + e * 1001 * h);
  // Attention: q and o of 3 heads, k and v of 1, the fp32 log-sum-exp; 3 sequences of 17.
  const ComputeOp* attn = findKernel(s, "attention");
  REQUIRE(attn);
  CHECK(attn->seqs == 3);
  CHECK(attn->seq == 17);
  CHECK(attn->kvHeads == 1);
  CHECK(attn->bytes == 2 * (T * 3 * 32 * e) + 2 * (T * 1 * 32 * e) + T * 3 * 4);
  // The optimizer and the gradient norm work on every parameter of the GPU (no ZeRO), once per step.
  const ComputeOp* adam = findKernel(s, "adam");
  REQUIRE(adam);
  CHECK(adam->pass == Pass::Step);
  CHECK(adam->dtype == DType::Float32);
  CHECK(static_cast<double>(adam->params) == s.denseParams + s.expertParams);
  CHECK(adam->bytes == 28.0 * static_cast<double>(adam->params));
  CHECK(findKernel(s, "grad-norm")->params == adam->params);
  // Mixed precision: the fp32 masters copied into the 16-bit parameters, the fp32 main gradients zeroed.
  const ComputeOp* copy = findKernel(s, "param-copy");
  const ComputeOp* zero = findKernel(s, "zero-grad");
  REQUIRE(copy);
  REQUIRE(zero);
  CHECK(copy->pass == Pass::Step);
  CHECK(copy->cls == KernelClass::Optimizer);
  CHECK(copy->params == adam->params);
  CHECK(copy->bytes == (4 + e) * static_cast<double>(adam->params));
  CHECK(zero->params == adam->params);
  CHECK(zero->bytes == 4.0 * static_cast<double>(adam->params));
  CHECK(zero->flops == 0);
  // Gradient-accumulation fusion (the default): the linear layers' weight-gradient GEMMs add into the fp32 main
  // gradient (their output read and written in fp32); a kernel per micro-batch adds the other gradients (the
  // embedding rows, the norms' weights).
  CHECK(w.training.gradAccumFusion);
  const ComputeOp* upW = findKernel(s, "mlp-up.wgrad");
  REQUIRE(upW);
  CHECK(upW->bytes == e * (T * h + T * 2 * 192) + 8.0 * h * 2 * 192);
  CHECK(findKernel(s, "mlp-up")->bytes == e * (T * h + h * 2 * 192) + e * T * 2 * 192);
  const ComputeOp* acc = findKernel(s, "grad-accum");
  REQUIRE(acc);
  CHECK(acc->pass == Pass::Backward);
  CHECK(acc->times == 1);
  CHECK(acc->cls == KernelClass::Optimizer);
  CHECK(static_cast<double>(acc->params) == 1001 * h + 2 * 2 * h + h);
  CHECK(acc->bytes == (e + 8) * static_cast<double>(acc->params));
  // Without it every parameter's 16-bit gradient is added into the buffer, and the GEMMs write 16-bit outputs.
  Workload wu = w;
  wu.training.gradAccumFusion = false;
  const StageLowering su = lowerStep(wu, resolveLayout(wu, 1)).stages[0];
  CHECK(findKernel(su, "mlp-up.wgrad")->bytes == e * (T * h + T * 2 * 192) + e * h * 2 * 192);
  CHECK(static_cast<double>(findKernel(su, "grad-accum")->params) == su.denseParams + su.expertParams);
  CHECK(workloadFromJson(workloadToJson(wu)).training.gradAccumFusion == false);
  // Norms and activations are not model FLOPs: MFU counts the matrix products only.
  double matmul = 0;
  for (const ComputeOp& op : s.compute)
    if (op.kind != ComputeKind::Other) matmul += op.flops * op.times;
  CHECK(step.modelFlopsPerStep == doctest::Approx(matmul * step.layout.microBatches).epsilon(1e-12));

  // Tensor parallelism 3 with sequence parallelism: norms and residual adds see T / 3 tokens, the activation
  // T tokens of 192 / 3 columns, rotary one q head and the replicated k head, the loss 334 of the vocabulary.
  const Workload w3 = oddWorkload(3, true);
  const StageLowering s3 = lowerStep(w3, resolveLayout(w3, 3)).stages[0];
  CHECK(findKernel(s3, "attn-norm")->tokens == 17);
  CHECK(findKernel(s3, "attn-norm")->flops == 5 * 17 * h);
  CHECK(findKernel(s3, "mlp-residual")->tokens == 17);
  CHECK(findKernel(s3, "final-norm")->tokens == 17);
  CHECK(findKernel(s3, "mlp-act")->tokens == 51);
  CHECK(findKernel(s3, "mlp-act")->hidden == 2 * 64);
  CHECK(findKernel(s3, "rope")->heads == 2);
  CHECK(findKernel(s3, "loss")->vocab == 334);
  CHECK(findKernel(s3, "embedding")->vocab == 334);
  CHECK(static_cast<double>(findKernel(s3, "adam")->params) == doctest::Approx(s3.denseParams));
  // Without sequence parallelism every tensor-parallel rank normalises all T tokens.
  const Workload w3n = oddWorkload(3, false);
  CHECK(findKernel(lowerStep(w3n, resolveLayout(w3n, 3)).stages[0], "attn-norm")->tokens == 51);

  // ZeRO 1 over 2 data-parallel ranks: the optimizer updates its shard of the parameters.
  Workload wz = oddWorkload(1, false);
  wz.layout.zero = 1;
  const StageLowering sz = lowerStep(wz, resolveLayout(wz, 2)).stages[0];
  CHECK(static_cast<double>(findKernel(sz, "adam")->params) == std::ceil(sz.denseParams / 2));
  CHECK(findKernel(sz, "param-copy")->params == findKernel(sz, "adam")->params);
  // ZeRO 1 keeps every gradient on the rank: the whole buffer is zeroed; ZeRO 2 shards it like the optimizer.
  CHECK(static_cast<double>(findKernel(sz, "zero-grad")->params) == std::ceil(sz.denseParams));
  wz.layout.zero = 2;
  const StageLowering sz2 = lowerStep(wz, resolveLayout(wz, 2)).stages[0];
  CHECK(findKernel(sz2, "zero-grad")->params == findKernel(sz2, "adam")->params);
  // Training in float32 keeps no masters: neither kernel runs.
  Workload wf = oddWorkload(1, false);
  wf.training.dtype = DType::Float32;
  const StageLowering sf = lowerStep(wf, resolveLayout(wf, 1)).stages[0];
  CHECK(findKernel(sf, "param-copy") == nullptr);
  CHECK(findKernel(sf, "zero-grad") == nullptr);
  CHECK(findKernel(sf, "grad-accum") == nullptr);

  // Full recomputation re-runs the layers' kernels (not the embedding, head or loss) as backward work.
  Workload wr = oddWorkload(1, false);
  wr.training.recompute = Recompute::Full;
  const StageLowering sr = lowerStep(wr, resolveLayout(wr, 1)).stages[0];
  const ComputeOp* rn = findKernel(sr, "attn-norm.recompute");
  REQUIRE(rn);
  CHECK(rn->recompute);
  CHECK(rn->pass == Pass::Backward);
  CHECK(rn->bytes == findKernel(sr, "attn-norm")->bytes);  // the forward's work again
  CHECK_FALSE(findKernel(sr, "loss.recompute"));
}

TEST_CASE("workload: fp8 training puts FP8 GEMMs, casts and amax in the census and FP8 copies in memory") {
  Workload w = oddWorkload(1, false);
  // training.dtype "fp8" parses to the recipe (bf16 elsewhere), writes back as "fp8", and a bad name lists it.
  Workload parsed = workloadFromJson(R"({"preset": "llama3-8b", "training": {"dtype": "fp8"}})");
  CHECK(parsed.training.fp8);
  CHECK(parsed.training.dtype == DType::BFloat16);
  CHECK(workloadToJson(parsed).find(R"("dtype": "fp8")") != std::string::npos);
  CHECK(workloadFromJson(workloadToJson(parsed)).training.fp8);
  CHECK_FALSE(workloadFromJson(R"({"preset": "llama3-8b", "training": {"dtype": "bf16"}})").training.fp8);
  expectError([] { workloadFromJson(R"({"preset": "llama3-8b", "training": {"dtype": "fp4"}})"); },
              ErrorCode::ParseError, "fp8");

  const Workload wb = w;
  const StepLowering bf = lowerStep(wb, resolveLayout(wb, 1));
  w.training.fp8 = true;
  const StepLowering f8 = lowerStep(w, resolveLayout(w, 1));
  const StageLowering& s = f8.stages[0];
  const double T = 51, h = 96, qkvN = (3 + 2) * 32, ffn = 192;
  // FP8 GEMMs: one-byte operands, bf16 output, the same FLOPs (model FLOPs unchanged).
  const ComputeOp* qkv = findKernel(s, "qkv");
  REQUIRE(qkv);
  CHECK(std::string(dtypeName(*qkv)) == "float8_e4m3");
  CHECK(qkv->bytes == T * h + h * qkvN + 2 * T * qkvN);
  CHECK(qkv->flops == findKernel(bf.stages[0], "qkv")->flops);
  CHECK(f8.modelFlopsPerStep == bf.modelFlopsPerStep);
  CHECK(std::string(dtypeName(*findKernel(s, "mlp-down.wgrad"))) == "float8_e4m3");
  // The weight gradient adds into the fp32 main gradient (gradient-accumulation fusion): read and written.
  CHECK(findKernel(s, "mlp-down.wgrad")->bytes == ffn * T + T * h + 8 * ffn * h);
  // The LM head stays in bf16, and nothing is cast for it.
  CHECK(std::string(dtypeName(*findKernel(s, "lm-head"))) == "bfloat16");
  CHECK(findKernel(s, "lm-head.cast") == nullptr);
  // The forward input: amax (bf16 in, 2 bytes per element) then cast-fp8 (2 in; the fp8 copy and its transpose
  // out) of T x h per layer.
  const ComputeOp* amax = findKernel(s, "qkv.amax");
  const ComputeOp* cast = findKernel(s, "qkv.cast");
  REQUIRE(amax);
  REQUIRE(cast);
  CHECK(amax->cls == KernelClass::Cast);
  CHECK(amax->kernel == "amax");
  CHECK(std::string(dtypeName(*amax)) == "bfloat16");
  CHECK(cast->kernel == "cast-fp8");
  CHECK(std::string(dtypeName(*cast)) == "float8_e4m3");
  CHECK(cast->elements == 51 * 96);
  CHECK(amax->bytes == 2 * T * h);
  CHECK(cast->bytes == 4 * T * h);
  CHECK(cast->flops == T * h);
  CHECK(cast->times == 2);
  CHECK(cast->pass == Pass::Forward);
  // The data gradient casts the output gradient (T x qkvN); the weight gradient reuses both casts.
  CHECK(findKernel(s, "qkv.dgrad.cast")->elements == 51 * 160);
  CHECK(findKernel(s, "qkv.dgrad.cast")->pass == Pass::Backward);
  CHECK(findKernel(s, "qkv.wgrad.cast") == nullptr);
  CHECK(findKernel(s, "qkv.cast.bwd") == nullptr);
  // The weights once per step (Transformer Engine caches the FP8 copy over the micro-batches).
  const ComputeOp* wcast = findKernel(s, "mlp-up.weight.cast");
  REQUIRE(wcast);
  CHECK(wcast->pass == Pass::Step);
  CHECK(wcast->elements == 96 * 384);
  CHECK(wcast->times == 2);
  CHECK(findKernel(s, "mlp-up.weight.amax")->bytes == 2.0 * 96 * 384);
  CHECK(findKernel(bf.stages[0], "qkv.cast") == nullptr);
  // With sequence parallelism TE casts the rank's slice before the all-gather: T / t rows for the column-parallel
  // inputs and the row-parallel output gradients, all T rows where nothing is gathered.
  Workload w3 = oddWorkload(3, true);
  w3.training.fp8 = true;
  const StageLowering s3 = lowerStep(w3, resolveLayout(w3, 3)).stages[0];
  CHECK(findKernel(s3, "qkv.cast")->elements == 17 * 96);
  CHECK(findKernel(s3, "mlp-up.cast")->elements == 17 * 96);
  CHECK(findKernel(s3, "attn-out.dgrad.cast")->elements == 17 * 96);
  CHECK(findKernel(s3, "mlp-down.cast")->elements == 51 * 64);
  CHECK(findKernel(s3, "qkv.dgrad.cast")->elements == 51 * 96);  // q, k, v of one head each: 96 columns

  // Memory: + 1 byte per FP8 GEMM parameter, the FP8 GEMMs' inputs saved in one byte: the qkv, mlp-up and attn-out
  // inputs (h each: 3 heads of 32) and the mlp-down input (ffn) a token, one byte less per layer.
  const MemoryEstimate mb = estimateMemory(wb, bf), mf = estimateMemory(w, f8);
  const double fp8Params = 2 * (h * qkvN + 96.0 * h + 3 * h * ffn);
  CHECK(s.fp8DenseParams == fp8Params);
  CHECK(mf.weights - mb.weights == doctest::Approx(fp8Params));
  CHECK(mf.gradients == mb.gradients);
  CHECK(mf.optimizer == mb.optimizer);
  CHECK(mb.activations - mf.activations == doctest::Approx((3 * h + ffn) * T * 2 * mf.inFlight));
}

TEST_CASE("workload: training.recompute selective with Megatron-LM's modules, core_attn by default") {
  const Workload d = workloadFromJson(R"({"preset": "llama3-8b", "training": {"recompute": "selective"}})");
  CHECK(d.training.recompute == Recompute::Selective);
  CHECK(recomputeModuleNames(d.training.recomputeModules) == std::vector<std::string>{"core_attn"});
  const Workload m = workloadFromJson(
      R"({"preset": "llama3-8b", "training": {"recompute": "selective", "recomputeModules": ["norms", "mlp"]}})");
  CHECK(recomputeModuleNames(m.training.recomputeModules) == std::vector<std::string>{"mlp", "norms"});
  CHECK(workloadToJson(workloadFromJson(workloadToJson(m))) == workloadToJson(m));
  auto bad = [](const std::string& text, const std::vector<std::string>& parts) {
    expectError([&] { workloadFromJson(text); }, ErrorCode::ParseError, parts);
  };
  bad(R"({"preset": "llama3-8b", "training": {"recompute": "some"}})",
      {"training.recompute must be \"none\", \"full\" or \"selective\""});
  bad(R"({"preset": "llama3-8b", "training": {"recompute": "selective", "recomputeModules": ["attn"]}})",
      {"training.recomputeModules entries must be", "(got string \"attn\")"});
  bad(R"({"preset": "llama3-8b", "training": {"recompute": "selective", "recomputeModules": []}})",
      {"training.recomputeModules must be a non-empty list"});
  bad(R"({"preset": "llama3-8b", "training": {"recompute": "full", "recomputeModules": ["mlp"]}})",
      {"training.recomputeModules needs \"recompute\": \"selective\""});
}

// mkernel — Megatron-LM / NeMo arguments read as a workload (workload_import.hpp).
#include <cstdint>
#include <map>
#include <set>
#include <sstream>

#include "mk/error.hpp"
#include "mk/workload/workload_import.hpp"

namespace mk {

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& key, const std::string& msg) {
  throw Error(ErrorCode::ParseError, where + ": " + key + ": " + msg);
}

}  // namespace

// ---- Megatron-LM arguments ------------------------------------------------------------------------------------

namespace {

/// Arguments that do not change the work of a step: optimisation hyper-parameters, data, checkpoints, logging,
/// numerics and kernel choices the planner does not model apart.
const std::set<std::string> kMegatronIgnored = {"--lr",
                                                "--min-lr",
                                                "--lr-decay-style",
                                                "--lr-warmup-iters",
                                                "--lr-warmup-fraction",
                                                "--lr-decay-iters",
                                                "--lr-warmup-samples",
                                                "--lr-decay-samples",
                                                "--weight-decay",
                                                "--clip-grad",
                                                "--adam-beta1",
                                                "--adam-beta2",
                                                "--adam-eps",
                                                "--init-method-std",
                                                "--seed",
                                                "--data-path",
                                                "--split",
                                                "--vocab-file",
                                                "--merge-file",
                                                "--tokenizer-type",
                                                "--tokenizer-model",
                                                "--save",
                                                "--load",
                                                "--save-interval",
                                                "--eval-interval",
                                                "--eval-iters",
                                                "--log-interval",
                                                "--train-iters",
                                                "--train-samples",
                                                "--tensorboard-dir",
                                                "--wandb-project",
                                                "--wandb-exp-name",
                                                "--exit-duration-in-mins",
                                                "--distributed-backend",
                                                "--attention-dropout",
                                                "--hidden-dropout",
                                                "--normalization",
                                                "--norm-epsilon",
                                                "--position-embedding-type",
                                                "--rotary-base",
                                                "--rotary-percent",
                                                "--max-position-embeddings",
                                                "--no-masked-softmax-fusion",
                                                "--use-flash-attn",
                                                "--use-mcore-models",
                                                "--transformer-impl",
                                                "--disable-bias-linear",
                                                "--attention-softmax-in-fp32",
                                                "--no-bias-gelu-fusion",
                                                "--no-bias-swiglu-fusion",
                                                "--no-rope-fusion",
                                                "--mock-data",
                                                "--log-throughput",
                                                "--log-timers-to-tensorboard",
                                                "--use-rotary-position-embeddings",
                                                "--apply-layernorm-1p",
                                                "--qk-layernorm",
                                                "--moe-router-load-balancing-type",
                                                "--moe-aux-loss-coeff",
                                                "--moe-z-loss-coeff",
                                                "--moe-grouped-gemm",
                                                "--moe-token-dispatcher-type",
                                                "--moe-router-dtype",
                                                "--attention-backend",
                                                "--ckpt-format",
                                                "--no-gradient-accumulation-fusion",
                                                "--fp8-amax-history-len",
                                                "--fp8-amax-compute-algo",
                                                "--fp8-margin",
                                                "--fp8-interval",
                                                "--num-workers",
                                                "--dataloader-type",
                                                "--no-create-attention-mask-in-dataloader",
                                                "--manual-gc",
                                                "--manual-gc-interval",
                                                "--timing-log-level",
                                                "--eod-mask-loss"};

/// Flags that take no value.
const std::set<std::string> kMegatronFlags = {"--sequence-parallel",
                                              "--use-distributed-optimizer",
                                              "--bf16",
                                              "--fp16",
                                              "--swiglu",
                                              "--squared-relu",
                                              "--untie-embeddings-and-output-weights",
                                              "--group-query-attention",
                                              "--overlap-grad-reduce",
                                              "--overlap-param-gather",
                                              "--tp-comm-overlap",
                                              "--no-overlap-p2p-communication",
                                              "--overlap-moe-expert-parallel-comm"};

/// `--key value...` pairs in order; a flag has no value, other arguments take every following token up to the next
/// one starting with "--".
std::vector<std::pair<std::string, std::vector<std::string>>> splitArgs(const std::string& text,
                                                                        const std::string& where) {
  std::vector<std::string> tokens;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const std::size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string word;
    while (words >> word)
      if (word != "\\") tokens.push_back(word);
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const std::string& t : tokens) {
    if (t.rfind("--", 0) == 0) {
      const std::size_t eq = t.find('=');
      out.push_back({t.substr(0, eq), {}});
      if (eq != std::string::npos) out.back().second.push_back(t.substr(eq + 1));
    } else if (out.empty()) {
      throw Error(ErrorCode::ParseError, where + ": '" + t + "': expected an argument starting with --");
    } else {
      out.back().second.push_back(t);
    }
  }
  return out;
}

uint64_t argCount(const std::string& where, const std::string& key, const std::vector<std::string>& v) {
  if (v.size() != 1) fail(where, key, "expected one value (got " + std::to_string(v.size()) + ")");
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(v[0], &used);
  } catch (...) {
    used = 0;
  }
  if (used != v[0].size() || v[0][0] == '-' || n == 0)
    fail(where, key, "expected a positive integer (got '" + v[0] + "')");
  return n;
}

uint32_t argCount32(const std::string& where, const std::string& key, const std::vector<std::string>& v) {
  const uint64_t n = argCount(where, key, v);
  if (n > UINT32_MAX) fail(where, key, "expected at most 4294967295 (got " + v[0] + ")");
  return static_cast<uint32_t>(n);
}

std::string argText(const std::string& where, const std::string& key, const std::vector<std::string>& v) {
  if (v.size() != 1) fail(where, key, "expected one value (got " + std::to_string(v.size()) + ")");
  return v[0];
}

}  // namespace

void applyMegatronArgs(Workload& w, const std::string& text, const std::string& where,
                       std::vector<std::string>& ignored) {
  const auto args = splitArgs(text, where);
  std::map<std::string, std::vector<std::string>> a;
  for (const auto& [key, values] : args) {
    if (kMegatronIgnored.count(key)) {
      ignored.push_back(key);
      continue;
    }
    if (kMegatronFlags.count(key) && !values.empty()) fail(where, key, "takes no value (got '" + values[0] + "')");
    a[key] = values;
  }
  auto has = [&](const char* k) { return a.count(k) > 0; };
  auto count = [&](const char* k) { return argCount(where, k, a.at(k)); };
  auto count32 = [&](const char* k) { return argCount32(where, k, a.at(k)); };
  auto take = [&](const char* k) { a.erase(k); };

  ModelShape& m = w.model;
  // Megatron-LM's defaults where an argument is absent: GeLU, tied embeddings, vocabulary padded to 128 x tp.
  m.activation = has("--swiglu")         ? Activation::SwiGlu
                 : has("--squared-relu") ? Activation::SquaredRelu
                                         : Activation::Gelu;
  m.tiedEmbeddings = !has("--untie-embeddings-and-output-weights");
  m.vocabPadMultiple = 128;
  for (const char* k : {"--swiglu", "--squared-relu", "--untie-embeddings-and-output-weights"}) take(k);
  if (has("--num-layers")) m.layers = count32("--num-layers");
  if (has("--hidden-size")) m.hidden = count("--hidden-size");
  if (has("--num-attention-heads")) m.heads = count32("--num-attention-heads");
  m.ffn = has("--ffn-hidden-size") ? count("--ffn-hidden-size") : 4 * m.hidden;  // Megatron-LM: 4 h by default
  m.kvHeads = m.heads;
  if (has("--group-query-attention")) {
    if (!has("--num-query-groups")) fail(where, "--group-query-attention", "needs --num-query-groups");
    m.kvHeads = count32("--num-query-groups");
  } else if (has("--num-query-groups")) {
    fail(where, "--num-query-groups", "needs --group-query-attention");
  }
  if (has("--kv-channels")) m.explicitHeadDim = count("--kv-channels");  // Megatron-LM: the head dim, h / heads
  for (const char* k : {"--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size",
                        "--group-query-attention", "--num-query-groups", "--kv-channels"})
    take(k);
  if (has("--padded-vocab-size")) {
    m.vocab = count("--padded-vocab-size");
    m.vocabPadMultiple = 1;
  } else if (has("--vocab-size")) {
    m.vocab = count("--vocab-size");
  }
  if (has("--make-vocab-size-divisible-by")) m.vocabPadMultiple = count32("--make-vocab-size-divisible-by");
  for (const char* k : {"--padded-vocab-size", "--vocab-size", "--make-vocab-size-divisible-by"}) take(k);
  if (has("--num-experts")) {
    MoeSpec moe = m.moe.value_or(MoeSpec{});
    moe.experts = count32("--num-experts");
    moe.topK = has("--moe-router-topk") ? count32("--moe-router-topk") : 2;  // Megatron-LM's default top 2
    if (has("--moe-ffn-hidden-size")) moe.ffn = count("--moe-ffn-hidden-size");
    m.moe = moe;
  } else if (has("--moe-router-topk")) {
    fail(where, "--moe-router-topk", "needs --num-experts");
  }
  for (const char* k : {"--num-experts", "--moe-router-topk", "--moe-ffn-hidden-size"}) take(k);

  TrainingSpec& t = w.training;
  if (has("--seq-length")) t.seq = count("--seq-length");
  if (has("--micro-batch-size")) t.microBatch = count32("--micro-batch-size");
  if (has("--global-batch-size")) t.globalBatch = count("--global-batch-size");
  t.dtype = has("--fp16") ? DType::Float16 : DType::BFloat16;
  if (!has("--bf16") && !has("--fp16"))
    fail(where, "--bf16", "missing: Megatron-LM trains in float32 without --bf16 or --fp16, which is not modelled");
  t.fp8 = false;
  if (has("--fp8-format")) {
    const std::string f = argText(where, "--fp8-format", a.at("--fp8-format"));
    if (f != "e4m3" && f != "hybrid") fail(where, "--fp8-format", "expected e4m3 or hybrid (got '" + f + "')");
    t.fp8 = true;
    t.dtype = DType::BFloat16;
  }
  for (const char* k :
       {"--seq-length", "--micro-batch-size", "--global-batch-size", "--bf16", "--fp16", "--fp8-format"})
    take(k);
  t.recompute = Recompute::None;
  t.recomputeModules = {};
  if (has("--recompute-granularity")) {
    const std::string g = argText(where, "--recompute-granularity", a.at("--recompute-granularity"));
    if (g == "full") {
      t.recompute = Recompute::Full;
      const std::string method =
          has("--recompute-method") ? argText(where, "--recompute-method", a.at("--recompute-method")) : "";
      if (method != "uniform" && method != "block")
        fail(where, "--recompute-method", "full recomputation needs uniform or block (got '" + method + "')");
      // uniform with 1 layer a chunk, or block over every layer of a stage, is full recomputation of each layer.
      const uint64_t n = has("--recompute-num-layers") ? count("--recompute-num-layers") : 1;
      if (method == "uniform" && n != 1)
        fail(where, "--recompute-num-layers",
             "uniform chunks of more than one layer are not expressible (got " + std::to_string(n) + "; use 1)");
      const uint64_t pp = has("--pipeline-model-parallel-size") ? count("--pipeline-model-parallel-size") : 1;
      if (method == "block" && n * pp < m.layers)
        fail(where, "--recompute-num-layers",
             "recomputing only some layers of a stage is not expressible (got " + std::to_string(n) + " of " +
                 std::to_string(m.layers / pp) + ")");
    } else if (g == "selective") {
      t.recompute = Recompute::Selective;
      if (!has("--recompute-modules")) t.recomputeModules.coreAttn = true;
      for (const std::string& mod :
           has("--recompute-modules") ? a.at("--recompute-modules") : std::vector<std::string>{})
        if (!setRecomputeModule(t.recomputeModules, mod))
          fail(where, "--recompute-modules", "'" + mod + "' is not expressible (core_attn, mlp, moe_act, layernorm)");
    } else {
      fail(where, "--recompute-granularity", "expected full or selective (got '" + g + "')");
    }
  } else if (has("--recompute-modules") || has("--recompute-method")) {
    fail(where, has("--recompute-modules") ? "--recompute-modules" : "--recompute-method",
         "needs --recompute-granularity");
  }
  for (const char* k :
       {"--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--recompute-modules"})
    take(k);

  // The layout: Megatron-LM's defaults where an argument is absent, data parallelism from the GPU count.
  ParallelLayout l;
  l.dp.reset();
  l.sp = has("--sequence-parallel");
  l.zero = has("--use-distributed-optimizer") ? 1 : 0;
  l.overlapGradReduce = has("--overlap-grad-reduce");
  l.overlapParamGather = has("--overlap-param-gather");
  l.tpCommOverlap = has("--tp-comm-overlap");
  l.overlapPpComm = !has("--no-overlap-p2p-communication");  // on by default (interleaved schedule only)
  l.overlapMoeA2a = has("--overlap-moe-expert-parallel-comm");
  for (const char* k :
       {"--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
        "--tp-comm-overlap", "--no-overlap-p2p-communication", "--overlap-moe-expert-parallel-comm"})
    take(k);
  if (has("--tensor-model-parallel-size")) l.tp = count32("--tensor-model-parallel-size");
  if (has("--pipeline-model-parallel-size")) l.pp = count32("--pipeline-model-parallel-size");
  if (has("--context-parallel-size")) l.cp = count32("--context-parallel-size");
  if (has("--expert-model-parallel-size")) l.ep = count32("--expert-model-parallel-size");
  // Megatron-LM sets an absent --expert-tensor-parallel-size to the tensor-parallel size (arguments.py).
  if (has("--expert-tensor-parallel-size"))
    l.etp = count32("--expert-tensor-parallel-size");
  else if (m.moe)
    l.etp = l.tp;
  const bool perStage = has("--num-layers-per-virtual-pipeline-stage");
  if (perStage && has("--virtual-pipeline-model-parallel-size"))
    fail(where, "--virtual-pipeline-model-parallel-size", "give it or --num-layers-per-virtual-pipeline-stage");
  if (perStage) {
    const uint64_t per = count("--num-layers-per-virtual-pipeline-stage");
    if (m.layers % (per * l.pp) != 0)
      fail(where, "--num-layers-per-virtual-pipeline-stage",
           std::to_string(per) + " x --pipeline-model-parallel-size does not divide --num-layers " +
               std::to_string(m.layers));
    l.virtualStages = static_cast<uint32_t>(m.layers / (per * l.pp));
  } else if (has("--virtual-pipeline-model-parallel-size")) {
    l.virtualStages = count32("--virtual-pipeline-model-parallel-size");
  }
  if (l.virtualStages > 1) l.schedule = PipelineSchedule::Interleaved;
  for (const char* k : {"--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                        "--expert-model-parallel-size", "--expert-tensor-parallel-size",
                        "--num-layers-per-virtual-pipeline-stage", "--virtual-pipeline-model-parallel-size"})
    take(k);
  if (!a.empty())
    fail(where, a.begin()->first,
         "unknown argument: not one this planner reads nor one known not to change the step (docs/planner.md, "
         "\"Importing configs\")");
  w.layout = l;
  validateWorkload(w);
}

}  // namespace mk

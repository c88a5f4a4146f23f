// mkernel — the built-in workloads: public models' shapes with the source of every number, and our default
// training step and layout for each (workload.hpp; docs/planner.md, "Presets").
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/workload/workload.hpp"

namespace mk {

namespace {

struct Preset {
  const char* name;
  const char* source;  ///< where the model numbers come from (docs/planner.md repeats it with links)
  Workload (*make)();
};

/// The training step and layout of a preset are our defaults, not the model authors' recipes unless the source
/// says so: chosen so that the model state fits an 80 GB GPU at the smallest GPU count the layout allows
/// (docs/planner.md, "Presets", cites every number).
Workload dense(const char* name, uint32_t layers, uint64_t hidden, uint64_t ffn, uint32_t heads, uint32_t kvHeads,
               uint64_t vocab) {
  Workload w;
  w.name = name;
  w.model.layers = layers;
  w.model.hidden = hidden;
  w.model.ffn = ffn;
  w.model.heads = heads;
  w.model.kvHeads = kvHeads;
  w.model.vocab = vocab;
  w.training.seq = 4096;
  w.training.microBatch = 1;
  w.training.globalBatch = 1024;
  w.training.dtype = DType::BFloat16;
  w.layout.zero = 1;
  return w;
}

/// Llama 3.1 (meta-llama/Llama-3.1-*B config.json): num_key_value_heads 8, vocab_size 128256, SwiGLU, untied.
Workload llama(const char* name, uint32_t layers, uint64_t hidden, uint64_t ffn, uint32_t heads) {
  Workload w = dense(name, layers, hidden, ffn, heads, 8, 128256);
  w.training.seq = 8192;  // Llama 3 pre-training context (arXiv 2407.21783, section 3.4)
  w.training.globalBatch = 512;
  return w;
}

Workload llama31_8b() {
  Workload w = llama("llama3.1-8b", 32, 4096, 14336, 32);
  w.layout.tp = 2;  // 4 B parameters per GPU: state and 8k-token activations fit 80 GB with ZeRO 1
  return w;
}

/// The earlier demo's name: the same shape, and the layout its measured records were taken with (TP 8, no ZeRO).
Workload llama3_8b() {
  Workload w = llama("llama3-8b", 32, 4096, 14336, 32);
  w.layout.tp = 8;
  w.layout.zero = 0;
  return w;
}

Workload llama31_70b() {
  Workload w = llama("llama3.1-70b", 80, 8192, 28672, 64);
  w.layout.tp = 8;
  w.layout.pp = 4;
  return w;
}

Workload llama31_405b() {
  Workload w = llama("llama3.1-405b", 126, 16384, 53248, 128);
  w.training.globalBatch = 2048;
  w.layout.tp = 8;  // Meta's 405B layout: TP 8, PP 16 (arXiv 2407.21783, Table 4)
  w.layout.pp = 16;
  return w;
}

/// An old name with the 3.1 model and layout.
template <Workload (*make)()>
Workload alias(const char* name) {
  Workload w = make();
  w.name = name;
  return w;
}
Workload llama3_70b() { return alias<llama31_70b>("llama3-70b"); }
Workload llama3_405b() { return alias<llama31_405b>("llama3-405b"); }

Workload gpt3_175b() {
  Workload w = dense("gpt3-175b", 96, 12288, 4 * 12288, 96, 96, 50257);
  w.model.activation = Activation::Gelu;
  w.model.tiedEmbeddings = true;
  w.training.seq = 2048;
  w.training.globalBatch = 1536;  // 3.2M tokens
  w.layout.tp = 8;
  w.layout.pp = 8;
  return w;
}

Workload nemotron4(const char* name, uint32_t layers, uint64_t hidden, uint32_t heads) {
  Workload w = dense(name, layers, hidden, 4 * hidden, heads, 8, 256000);
  w.model.activation = Activation::SquaredRelu;
  w.layout.tp = 8;
  return w;
}

Workload nemotron4_15b() { return nemotron4("nemotron4-15b", 32, 6144, 48); }

Workload nemotron4_340b() {
  Workload w = nemotron4("nemotron4-340b", 96, 18432, 96);
  w.training.globalBatch = 2304;
  w.layout.pp = 12;
  return w;
}

/// Mixtral (mistralai/Mixtral-8x*B-v0.1 config.json): num_local_experts 8, num_experts_per_tok 2, experts of
/// intermediate_size, 8 KV heads, vocab_size 32000.
Workload mixtral(const char* name, uint32_t layers, uint64_t hidden, uint64_t ffn, uint32_t heads, uint32_t pp) {
  Workload w = dense(name, layers, hidden, ffn, heads, 8, 32000);
  w.model.moe = MoeSpec{8, 2, 0};
  w.layout.tp = 2;
  w.layout.pp = pp;
  w.layout.ep = 8;
  return w;
}

Workload mixtral_8x7b() { return mixtral("mixtral-8x7b", 32, 4096, 14336, 32, 2); }
Workload mixtral_8x22b() { return mixtral("mixtral-8x22b", 56, 6144, 16384, 48, 4); }

Workload deepseek_v3() {
  Workload w = dense("deepseek-v3", 61, 7168, 18432, 128, 128, 129280);
  MoeSpec moe{256, 8, 2048};
  moe.sharedExperts = 1;
  moe.firstDenseLayers = 3;
  w.model.moe = moe;
  w.model.mla = MlaSpec{1536, 512, 128, 64, 128};
  w.training.globalBatch = 15360;
  // The report's memory savings we model: RMSNorm recomputed, the MoE SwiGLU's output recomputed from its cached
  // input (arXiv 2412.19437, 3.3.2); without them the first stage's 16 micro-batches in flight exceed 80 GB.
  w.training.recompute = Recompute::Selective;
  w.training.recomputeModules.norms = true;
  w.training.recomputeModules.moeAct = true;
  w.layout.pp = 16;  // DeepSeek-V3's own layout: PP 16, EP 64, ZeRO 1, no TP (arXiv 2412.19437, 3.2)
  w.layout.ep = 64;
  return w;
}

Workload qwen3_moe(const char* name, uint32_t layers, uint64_t hidden, uint64_t ffn, uint32_t heads,
                   uint64_t expertFfn) {
  Workload w = dense(name, layers, hidden, ffn, heads, 4, 151936);
  w.model.explicitHeadDim = 128;
  w.model.moe = MoeSpec{128, 8, expertFfn};
  return w;
}

Workload qwen3_30b() {
  Workload w = qwen3_moe("qwen3-30b-a3b", 48, 2048, 6144, 32, 768);
  w.layout.ep = 8;
  return w;
}

Workload qwen3_235b() {
  Workload w = qwen3_moe("qwen3-235b-a22b", 94, 4096, 12288, 64, 1536);
  w.layout.tp = 2;
  w.layout.pp = 8;
  w.layout.ep = 16;
  return w;
}

Workload gpt_oss_120b() {
  Workload w = dense("gpt-oss-120b", 36, 2880, 2880, 64, 8, 201088);
  w.model.explicitHeadDim = 64;
  w.model.moe = MoeSpec{128, 4, 2880};
  w.model.slidingWindow = 128;
  w.model.slidingPattern = {1, 0};  // layer_types: sliding_attention, full_attention, ...
  w.layout.pp = 4;
  w.layout.ep = 8;
  return w;
}

const Preset kPresets[] = {
    {"gpt3-175b",
     "OpenAI GPT-3 175B: arXiv 2005.14165 Table 2.1 (96 layers, d_model 12288, 96 heads of 128, 2048 tokens, "
     "3.2M-token batch), GPT-2 vocabulary 50257, tied embeddings",
     gpt3_175b},
    {"nemotron4-15b", "NVIDIA Nemotron-4 15B: arXiv 2402.16819 Table 1 (layout: section 2.3, TP 8)", nemotron4_15b},
    {"nemotron4-340b", "NVIDIA Nemotron-4 340B: arXiv 2406.11704 Tables 1 and 2 (TP 8, PP 12, final batch 2304)",
     nemotron4_340b},
    {"llama3.1-8b", "Meta Llama 3.1 8B: huggingface.co/meta-llama/Llama-3.1-8B config.json", llama31_8b},
    {"llama3.1-70b", "Meta Llama 3.1 70B: huggingface.co/meta-llama/Llama-3.1-70B config.json", llama31_70b},
    {"llama3.1-405b",
     "Meta Llama 3.1 405B: huggingface.co/meta-llama/Llama-3.1-405B config.json (layout: arXiv 2407.21783, "
     "Table 4)",
     llama31_405b},
    {"llama3-8b",
     "Meta Llama 3 8B: huggingface.co/meta-llama/Meta-Llama-3-8B config.json; the earlier demo's layout (TP 8)",
     llama3_8b},
    {"llama3-70b", "alias of llama3.1-70b (the same shape as Meta-Llama-3-70B)", llama3_70b},
    {"llama3-405b", "alias of llama3.1-405b", llama3_405b},
    {"mixtral-8x7b", "Mistral AI Mixtral 8x7B: huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json", mixtral_8x7b},
    {"mixtral-8x22b", "Mistral AI Mixtral 8x22B: huggingface.co/mistralai/Mixtral-8x22B-v0.1 config.json",
     mixtral_8x22b},
    {"deepseek-v3",
     "DeepSeek-V3: huggingface.co/deepseek-ai/DeepSeek-V3 config.json (MTP module not modelled; layout: arXiv "
     "2412.19437)",
     deepseek_v3},
    {"qwen3-30b-a3b", "Qwen3-30B-A3B: huggingface.co/Qwen/Qwen3-30B-A3B config.json", qwen3_30b},
    {"qwen3-235b-a22b", "Qwen3-235B-A22B: huggingface.co/Qwen/Qwen3-235B-A22B config.json", qwen3_235b},
    {"gpt-oss-120b",
     "OpenAI gpt-oss-120b: huggingface.co/openai/gpt-oss-120b config.json (biases and attention sinks not "
     "modelled)",
     gpt_oss_120b},
};

const Preset* findPreset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

std::string presetList() {
  std::string out;
  for (const Preset& p : kPresets) out += (out.empty() ? "" : ", ") + std::string(p.name);
  return out;
}

}  // namespace

std::vector<std::string> workloadPresets() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.emplace_back(p.name);
  return out;
}

Workload workloadPreset(const std::string& name) {
  const Preset* p = findPreset(name);
  if (!p) throw Error(ErrorCode::NotFound, "unknown workload preset '" + name + "' (known: " + presetList() + ")");
  Workload w = p->make();
  validateWorkload(w);
  return w;
}

std::string workloadPresetSource(const std::string& name) {
  const Preset* p = findPreset(name);
  return p ? p->source : "";
}

}  // namespace mk

// mkernel — a Hugging Face config.json read as a workload's model (workload_import.hpp).
#include "mk/workload/workload_import.hpp"

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>

#include "mk/error.hpp"
#include "mk/io/json.hpp"

namespace mk {

namespace {

using Json = nlohmann::json;

[[noreturn]] void fail(const std::string& where, const std::string& key, const std::string& msg) {
  throw Error(ErrorCode::ParseError, where + ": " + key + ": " + msg);
}

// ---- Hugging Face config.json ---------------------------------------------------------------------------------

/// Keys that do not change the work of a training step: numerics of norms and rotary embeddings, token ids,
/// dropout, initialisation, routing losses and bookkeeping.
const std::set<std::string> kHfIgnored = {"architectures",
                                          "model_type",
                                          "torch_dtype",
                                          "dtype",
                                          "transformers_version",
                                          "rope_theta",
                                          "rope_scaling",
                                          "rms_norm_eps",
                                          "layer_norm_eps",
                                          "layer_norm_epsilon",
                                          "norm_eps",
                                          "initializer_range",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "pad_token_id",
                                          "use_cache",
                                          "attention_dropout",
                                          "hidden_dropout",
                                          "resid_pdrop",
                                          "embd_pdrop",
                                          "attn_pdrop",
                                          "attention_bias",
                                          "mlp_bias",
                                          "qkv_bias",
                                          "pretraining_tp",
                                          "max_position_embeddings",
                                          "n_positions",
                                          "n_ctx",
                                          "router_aux_loss_coef",
                                          "output_router_logits",
                                          "router_jitter_noise",
                                          "norm_topk_prob",
                                          "routed_scaling_factor",
                                          "scoring_func",
                                          "topk_method",
                                          "n_group",
                                          "topk_group",
                                          "aux_loss_alpha",
                                          "seq_aux",
                                          "ep_size",
                                          "num_nextn_predict_layers",
                                          "swiglu_limit",
                                          "rope_interleave",
                                          "partial_rotary_factor",
                                          "max_window_layers",
                                          "use_sliding_window",
                                          "router_bias",
                                          "auto_map",
                                          "quantization_config",
                                          "scale_attn_weights",
                                          "reorder_and_upcast_attn",
                                          "scale_attn_by_inverse_layer_idx",
                                          "summary_type",
                                          "summary_use_proj",
                                          "summary_activation",
                                          "summary_proj_to_labels",
                                          "summary_first_dropout",
                                          "task_specific_params",
                                          "kv_channels",
                                          "initial_context_length"};

class HfReader {
 public:
  HfReader(const Json& j, std::string where) : j_(j), where_(std::move(where)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  /// The first present key of `keys`, or "".
  std::string pick(std::initializer_list<const char*> keys) const {
    for (const char* k : keys)
      if (has(k)) return k;
    return "";
  }
  uint64_t count(const std::string& key) const {
    const Json& v = j_.at(key);
    if (!v.is_number_unsigned() || v.get<uint64_t>() == 0)
      fail(where_, key, "expected a positive integer (got " + describeJson(v) + ")");
    return v.get<uint64_t>();
  }
  uint32_t count32(const std::string& key) const {
    const uint64_t v = count(key);
    if (v > UINT32_MAX) fail(where_, key, "expected at most 4294967295 (got " + std::to_string(v) + ")");
    return static_cast<uint32_t>(v);
  }
  std::string text(const std::string& key) const {
    const Json& v = j_.at(key);
    if (!v.is_string()) fail(where_, key, "expected a string (got " + describeJson(v) + ")");
    return v.get<std::string>();
  }
  bool flag(const std::string& key) const {
    const Json& v = j_.at(key);
    if (!v.is_boolean()) fail(where_, key, "expected true or false (got " + describeJson(v) + ")");
    return v.get<bool>();
  }
  const Json& value(const std::string& key) const { return j_.at(key); }
  [[noreturn]] void bad(const std::string& key, const std::string& msg) const { fail(where_, key, msg); }

 private:
  const Json& j_;
  std::string where_;
};

Activation hfActivation(const HfReader& r, const std::string& modelType) {
  const std::string key = r.pick({"hidden_act", "activation_function"});
  const std::string act = key.empty() ? "silu" : r.text(key);
  const bool gated =
      modelType != "gpt2" && modelType != "nemotron" && modelType != "gpt_neox" && modelType != "gpt_bigcode";
  if (act == "silu" || act == "swish") {
    if (!gated) r.bad(key, "a non-gated SiLU MLP is not expressible (got \"" + act + "\" with " + modelType + ")");
    return Activation::SwiGlu;
  }
  if (act == "gelu" || act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast")
    return gated ? Activation::GeGlu : Activation::Gelu;
  if (act == "relu2" && !gated) return Activation::SquaredRelu;
  r.bad(key, "expected silu, gelu (or gelu_new, gelu_pytorch_tanh) or relu2 (got \"" + act + "\")");
}

void hfMoe(const HfReader& r, ModelShape& m) {
  const std::string experts = r.pick({"num_local_experts", "n_routed_experts", "num_experts"});
  if (experts.empty()) {
    for (const char* k : {"num_experts_per_tok", "experts_per_token", "moe_intermediate_size", "n_shared_experts"})
      if (r.has(k) &&
          !(std::string(k) == "num_experts_per_tok" && r.value(k).is_number() && r.value(k).get<double>() == 0))
        r.bad(k, "a mixture-of-experts key without num_local_experts / n_routed_experts / num_experts");
    return;
  }
  MoeSpec moe;
  moe.experts = r.count32(experts);
  const std::string topK = r.pick({"num_experts_per_tok", "experts_per_token"});
  if (topK.empty()) r.bad(experts, "needs num_experts_per_tok (the experts each token is sent to)");
  moe.topK = r.count32(topK);
  if (r.has("moe_intermediate_size")) moe.ffn = r.count("moe_intermediate_size");
  if (r.has("n_shared_experts")) moe.sharedExperts = r.count32("n_shared_experts");
  if (r.has("first_k_dense_replace") && r.value("first_k_dense_replace") != 0)
    moe.firstDenseLayers = r.count32("first_k_dense_replace");
  if (r.has("moe_layer_freq")) moe.layerFreq = r.count32("moe_layer_freq");
  // Qwen's rule: layer i is sparse when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers.
  if (r.has("decoder_sparse_step") && r.count("decoder_sparse_step") != 1)
    r.bad("decoder_sparse_step",
          "only 1 (every layer a MoE layer) is expressible (got " + describeJson(r.value("decoder_sparse_step")) + ")");
  if (r.has("mlp_only_layers") && !(r.value("mlp_only_layers").is_array() && r.value("mlp_only_layers").empty()))
    r.bad("mlp_only_layers", "dense layers at chosen indices are not expressible (only first_k_dense_replace)");
  m.moe = moe;
}

void hfAttentionShape(const HfReader& r, ModelShape& m) {
  if (r.has("head_dim")) m.explicitHeadDim = r.count("head_dim");
  const std::string mla = r.pick({"kv_lora_rank", "q_lora_rank", "qk_rope_head_dim"});
  if (!mla.empty()) {
    MlaSpec s;
    if (r.has("q_lora_rank")) s.qLoraRank = r.count("q_lora_rank");
    for (const char* k : {"kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"})
      if (!r.has(k))
        r.bad(k,
              "missing: multi-head latent attention needs kv_lora_rank, qk_nope_head_dim, "
              "qk_rope_head_dim and v_head_dim");
    s.kvLoraRank = r.count("kv_lora_rank");
    s.qkNopeHeadDim = r.count("qk_nope_head_dim");
    s.qkRopeHeadDim = r.count("qk_rope_head_dim");
    s.vHeadDim = r.count("v_head_dim");
    m.mla = s;
  }
  const bool swa = r.has("sliding_window") && !(r.has("use_sliding_window") && !r.flag("use_sliding_window"));
  if (swa) m.slidingWindow = r.count("sliding_window");
  if (r.has("layer_types")) {
    const Json& types = r.value("layer_types");
    if (!types.is_array()) r.bad("layer_types", "expected a list (got " + describeJson(types) + ")");
    std::vector<uint8_t> pattern;
    for (const Json& t : types) {
      const std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s != "sliding_attention" && s != "full_attention")
        r.bad("layer_types",
              "entries must be \"sliding_attention\" or \"full_attention\" (got " + describeJson(t) + ")");
      pattern.push_back(s == "sliding_attention" ? 1 : 0);
    }
    if (std::find(pattern.begin(), pattern.end(), 1) != pattern.end()) {
      if (!swa) r.bad("layer_types", "sliding_attention layers without a sliding_window");
      m.slidingPattern = pattern;
    }
  }
}

}  // namespace

void applyHfConfig(Workload& w, const std::string& text, const std::string& where, std::vector<std::string>& ignored) {
  const Json j = parseJson(text, where, kMaxConfigJsonBytes);
  if (!j.is_object()) throw Error(ErrorCode::ParseError, where + ": expected a JSON object (a config.json)");
  const HfReader r(j, where);
  static const std::set<std::string> kRead = {"num_hidden_layers",   "n_layer",
                                              "hidden_size",         "n_embd",
                                              "intermediate_size",   "n_inner",
                                              "num_attention_heads", "n_head",
                                              "num_key_value_heads", "head_dim",
                                              "vocab_size",          "tie_word_embeddings",
                                              "hidden_act",          "activation_function",
                                              "num_local_experts",   "n_routed_experts",
                                              "num_experts",         "num_experts_per_tok",
                                              "experts_per_token",   "moe_intermediate_size",
                                              "n_shared_experts",    "first_k_dense_replace",
                                              "moe_layer_freq",      "q_lora_rank",
                                              "kv_lora_rank",        "qk_nope_head_dim",
                                              "qk_rope_head_dim",    "v_head_dim",
                                              "sliding_window",      "layer_types",
                                              "decoder_sparse_step", "mlp_only_layers"};
  for (const auto& [key, value] : j.items()) {
    if (kRead.count(key)) continue;
    if (kHfIgnored.count(key)) {
      ignored.push_back(key);
      continue;
    }
    fail(where, key,
         "unknown key: not a shape this planner reads nor one known not to change the step; remove it "
         "if it does not change the work of a step");
  }
  const std::string modelType = r.has("model_type") ? r.text("model_type") : "";
  ModelShape m;
  auto need = [&](std::initializer_list<const char*> keys) {
    const std::string k = r.pick(keys);
    if (k.empty()) throw Error(ErrorCode::ParseError, where + ": missing key " + *keys.begin());
    return k;
  };
  m.layers = r.count32(need({"num_hidden_layers", "n_layer"}));
  m.hidden = r.count(need({"hidden_size", "n_embd"}));
  m.heads = r.count32(need({"num_attention_heads", "n_head"}));
  m.kvHeads = r.has("num_key_value_heads") ? r.count32("num_key_value_heads") : m.heads;
  m.vocab = r.count(need({"vocab_size"}));
  const std::string ffn = r.pick({"intermediate_size", "n_inner"});
  m.ffn = ffn.empty() ? 4 * m.hidden : r.count(ffn);  // GPT-2: n_inner null = 4 x n_embd
  m.activation = hfActivation(r, modelType);
  // transformers' PretrainedConfig ties by default; the Llama, Mixtral, Qwen3, DeepSeek-V3 configs set false.
  m.tiedEmbeddings = r.has("tie_word_embeddings") ? r.flag("tie_word_embeddings") : modelType == "gpt2";
  m.vocabPadMultiple = 1;  // a Hugging Face model's embedding is vocab_size rows as given
  hfMoe(r, m);
  hfAttentionShape(r, m);
  w.model = m;
  validateWorkload(w);
}

}  // namespace mk

// mkernel — YAML training recipes read as a workload (workload_import.hpp): a Megatron-LM --yaml-cfg file or a NeMo
// 1.x recipe becomes the Megatron-LM argument list that applyMegatronArgs reads, so that the meaning of every
// argument (defaults, checks, what is not expressible) has one home. This file only renames keys.
#include <yaml-cpp/yaml.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/workload/workload_import.hpp"

namespace mk {

namespace {

/// One argument of the list being built and the YAML path it came from (errors and the note name the path).
struct RecipeArgs {
  std::string where;
  std::vector<std::pair<std::string, std::vector<std::string>>> args;
  std::map<std::string, std::string> origin;  ///< "--seq-length" -> "model.encoder_seq_length"

  void add(const std::string& arg, const std::vector<std::string>& values, const std::string& path) {
    args.push_back({arg, values});
    origin.emplace(arg, path);
  }
  [[noreturn]] void fail(const std::string& path, const std::string& msg) const {
    throw Error(ErrorCode::ParseError, where + ": " + path + ": " + msg);
  }
};

std::string dashed(const std::string& key) {
  std::string arg = "--" + key;
  for (char& c : arg)
    if (c == '_') c = '-';
  return arg;
}

bool isTrue(const YAML::Node& n) {
  return n.IsScalar() && (n.Scalar() == "true" || n.Scalar() == "True" || n.Scalar() == "TRUE");
}
bool isFalse(const YAML::Node& n) {
  return n.IsScalar() && (n.Scalar() == "false" || n.Scalar() == "False" || n.Scalar() == "FALSE");
}

/// The values of a scalar or a list of scalars; an OmegaConf interpolation ("${...}") is not resolved here.
std::vector<std::string> values(const RecipeArgs& r, const YAML::Node& n, const std::string& path) {
  std::vector<std::string> out;
  if (n.IsScalar()) {
    out.push_back(n.Scalar());
  } else if (n.IsSequence()) {
    for (const YAML::Node& item : n) {
      if (!item.IsScalar()) r.fail(path, "expected a list of values (got a nested list or map)");
      out.push_back(item.Scalar());
    }
  } else {
    r.fail(path, "expected a value or a list of values (got a map)");
  }
  for (const std::string& v : out)
    if (v.find("${") != std::string::npos)
      r.fail(path, "'" + v + "' is an interpolation, which is not resolved: give the value");
  return out;
}

/// `key: value` the way Megatron-LM turns it into an argument: true -> the flag, false or null -> absent (the
/// default), a list -> its values.
void addArgument(RecipeArgs& r, const std::string& arg, const YAML::Node& n, const std::string& path) {
  if (n.IsNull() || isFalse(n)) return;
  r.add(arg, isTrue(n) ? std::vector<std::string>{} : values(r, n, path), path);
}

/// The entries of a map in order; a key given twice is an error (yaml-cpp keeps both and reads the first).
std::vector<std::pair<std::string, YAML::Node>> entries(const RecipeArgs& r, const YAML::Node& map,
                                                        const std::string& prefix) {
  std::vector<std::pair<std::string, YAML::Node>> out;
  std::set<std::string> seen;
  for (const auto& kv : map) {
    const std::string key = kv.first.Scalar();
    if (!seen.insert(key).second) r.fail(prefix + key, "given twice");
    out.push_back({key, kv.second});
  }
  return out;
}

/// Keys of either recipe kind that do not change the work of a step (initialisation, dropout, fusions, numerics
/// the planner does not price apart, logging, checkpoints, data) and that have no Megatron-LM argument spelled
/// the same. Keys spelled as an argument are listed by applyMegatronArgs.
const std::set<std::string> kRecipeIgnored = {
    // NeMo 1.x megatron_gpt_config.yaml, model:
    "mcore_gpt", "rampup_batch_size", "resume_from_checkpoint", "max_position_embeddings", "init_method_std",
    "use_scaled_init_method", "hidden_dropout", "attention_dropout", "ffn_dropout", "apply_query_key_layer_scaling",
    "normalization", "layernorm_epsilon", "do_layer_norm_weight_decay", "pre_process", "post_process",
    "persist_layer_norm", "bias", "headscale", "transformer_block_type", "openai_gelu", "normalize_attention_scores",
    "position_embedding_type", "rotary_percentage", "rotary_base", "attention_type", "batch_p2p_comm", "tokenizer",
    "native_amp_init_scale", "native_amp_growth_interval", "hysteresis", "fp32_residual_connection",
    "fp16_lm_cross_entropy", "megatron_amp_O2", "grad_allreduce_chunk_size_mb", "grad_div_ar_fusion",
    "gradient_accumulation_fusion", "bias_activation_fusion", "bias_dropout_add_fusion", "masked_softmax_fusion",
    "get_attention_mask_from_fusion", "apply_rope_fusion", "seed", "use_cpu_initialization", "onnx_safe",
    "apex_transformer_log_level", "gradient_as_bucket_view", "sync_batch_comm", "nsys_profile", "transformer_engine",
    "fp8_margin", "fp8_interval", "fp8_amax_history_len", "fp8_amax_compute_algo", "reduce_amax", "use_emha",
    "ub_tp_comm_overlap_cfg", "use_flash_attention", "cpu_offloading", "data", "moe_aux_loss_coeff",
    "moe_router_load_balancing_type", "moe_grouped_gemm", "moe_token_dispatcher_type", "moe_z_loss_coeff",
    "cross_entropy_loss_fusion", "deterministic_mode",
    // Megatron-LM's YAML (TransformerConfig and ModelParallelConfig names)
    "layernorm_zero_centered_gamma", "add_bias_linear", "add_qkv_bias", "bias_swiglu_fusion", "bias_dropout_fusion",
    "memory_efficient_layer_norm", "fp8_wgrad", "clone_scatter_output_in_embedding", "perform_initialization",
    "async_tensor_model_parallel_allreduce", "tp_comm_split_ag", "tp_comm_atomic_ag", "tp_comm_split_rs",
    "tp_comm_atomic_rs", "tp_comm_bulk_wgrad", "tp_comm_bulk_dgrad", "batch_p2p_sync", "barrier_with_L1_time",
    "cpu_offloading_activations", "check_for_nan_in_loss_and_grad", "delay_grad_reduce",
    "scatter_gather_tensors_in_pipeline", "bert_binary_head", "log_params_norm", "log_num_zeros_in_grad", "optimizer",
    "lr_warmup_init", "weight_decay_incr_style", "sgd_momentum", "initial_loss_scale", "min_loss_scale",
    "loss_scale_window", "distributed_timeout_minutes", "adlr_autoresume_interval", "manual_gc_eval",
    "retriever_seq_length", "sample_rate", "mask_prob", "short_seq_prob", "vocab_extra_ids", "profile_ranks",
    "profile_step_end", "profile_step_start", "timing_log_option", "tensorboard_log_interval", "tensorboard_queue_size",
    "log_loss_scale_to_tensorboard", "enable_one_logger", "one_logger_project", "wandb_save_dir"};

// ---- Megatron-LM --yaml-cfg ------------------------------------------------------------------------------------

/// Megatron-LM's YAML: top-level argument names plus the `language_model:` (TransformerConfig) and
/// `model_parallel:` (ModelParallelConfig) sections (megatron/training/yaml_arguments.py). A key is its argument
/// with dashes, except the few TransformerConfig fields whose argument is spelled otherwise.
void megatronKey(RecipeArgs& r, const std::string& key, const YAML::Node& node, const std::string& path,
                 std::vector<std::string>& ignored) {
  if (kRecipeIgnored.count(key)) {
    ignored.push_back(path);
  } else if (key == "num_moe_experts") {
    addArgument(r, "--num-experts", node, path);
  } else if (key == "activation_func") {
    const std::string f = node.IsNull() ? "gelu" : values(r, node, path).at(0);
    if (f == "swiglu" || f == "squared_relu")
      r.add(f == "swiglu" ? "--swiglu" : "--squared-relu", {}, path);
    else if (f != "gelu")
      r.fail(path, "expected swiglu, squared_relu or gelu (got '" + f + "')");
  } else if (key == "gated_linear_unit") {
    // implied by activation_func: swiglu (Megatron-LM's --swiglu sets both)
  } else if (key == "fp8") {
    addArgument(r, "--fp8-format", node, path);
  } else if (key == "overlap_p2p_comm") {
    if (isFalse(node)) r.add("--no-overlap-p2p-communication", {}, path);
  } else {
    addArgument(r, dashed(key), node, path);
  }
}

void megatronYaml(RecipeArgs& r, const YAML::Node& root, std::vector<std::string>& ignored) {
  for (const auto& [key, node] : entries(r, root, "")) {
    if ((key == "language_model" || key == "model_parallel") && node.IsMap()) {
      for (const auto& [sub, value] : entries(r, node, key + ".")) megatronKey(r, sub, value, key + "." + sub, ignored);
    } else {
      megatronKey(r, key, node, key, ignored);
    }
  }
}

// ---- NeMo 1.x ----------------------------------------------------------------------------------------------------

/// NeMo names under `model:` whose Megatron-LM argument is spelled otherwise; the keys not here and not ignored
/// are spelled as their argument (`num_layers` -> --num-layers) when they are in kNemoSame.
const std::map<std::string, std::string> kNemoRenamed = {
    {"encoder_seq_length", "--seq-length"},
    {"activations_checkpoint_granularity", "--recompute-granularity"},
    {"activations_checkpoint_method", "--recompute-method"},
    {"activations_checkpoint_num_layers", "--recompute-num-layers"},
    {"ub_tp_comm_overlap", "--tp-comm-overlap"},
    {"num_moe_experts", "--num-experts"}};

/// NeMo names under `model:` spelled as their Megatron-LM argument.
const std::set<std::string> kNemoSame = {"micro_batch_size",
                                         "global_batch_size",
                                         "tensor_model_parallel_size",
                                         "pipeline_model_parallel_size",
                                         "virtual_pipeline_model_parallel_size",
                                         "context_parallel_size",
                                         "expert_model_parallel_size",
                                         "expert_tensor_parallel_size",
                                         "num_layers",
                                         "hidden_size",
                                         "ffn_hidden_size",
                                         "num_attention_heads",
                                         "kv_channels",
                                         "make_vocab_size_divisible_by",
                                         "sequence_parallel",
                                         "moe_router_topk",
                                         "moe_ffn_hidden_size"};

void nemoModel(RecipeArgs& r, const YAML::Node& model, std::vector<std::string>& ignored) {
  bool fp8 = false, e4m3 = false, overlapP2p = false;
  for (const auto& [key, node] : entries(r, model, "model.")) {
    const std::string path = "model." + key;
    const auto renamed = kNemoRenamed.find(key);
    if (renamed != kNemoRenamed.end()) {
      addArgument(r, renamed->second, node, path);
    } else if (kNemoSame.count(key)) {
      addArgument(r, dashed(key), node, path);
    } else if (key == "num_query_groups") {
      addArgument(r, "--num-query-groups", node, path);
      if (!node.IsNull()) r.add("--group-query-attention", {}, path);
    } else if (key == "share_embeddings_and_output_weights") {
      if (isFalse(node)) r.add("--untie-embeddings-and-output-weights", {}, path);
    } else if (key == "activation") {
      const std::string f = values(r, node, path).at(0);
      if (f == "swiglu" || f == "squared-relu")
        r.add(f == "swiglu" ? "--swiglu" : "--squared-relu", {}, path);
      else if (f != "gelu" && f != "fast-gelu" && f != "approx-gelu")
        r.fail(path, "expected swiglu, squared-relu or gelu (got '" + f + "'): other activations are not expressible");
    } else if (key == "fp8" || key == "fp8_e4m3" || key == "fp8_hybrid") {
      if (key == "fp8") fp8 = isTrue(node);
      if (key == "fp8_e4m3") e4m3 = isTrue(node);
    } else if (key == "overlap_p2p_comm") {
      overlapP2p = isTrue(node);
    } else if (key == "optim" && node.IsMap()) {
      // NeMo picks the distributed optimizer (ZeRO 1) by name; its overlap switches are the DP overlap.
      for (const auto& [sub, value] : entries(r, node, path + ".")) {
        if (sub == "name" && value.IsScalar() && value.Scalar() == "distributed_fused_adam")
          r.add("--use-distributed-optimizer", {}, path + ".name");
        else if (sub == "overlap_grad_sync")
          addArgument(r, "--overlap-grad-reduce", value, path + "." + sub);
        else if (sub == "overlap_param_sync")
          addArgument(r, "--overlap-param-gather", value, path + "." + sub);
        else
          ignored.push_back(path + "." + sub);
      }
    } else if (kRecipeIgnored.count(key)) {
      ignored.push_back(path);
    } else {
      r.fail(path,
             "unknown key: not one this planner reads nor one known not to change the step (docs/planner.md, "
             "\"Importing configs\")");
    }
  }
  if (fp8) r.add("--fp8-format", {e4m3 ? "e4m3" : "hybrid"}, "model.fp8");
  // NeMo leaves PP send/receive overlap off unless overlap_p2p_comm is set; Megatron-LM's default is on.
  if (!overlapP2p) r.add("--no-overlap-p2p-communication", {}, "model.overlap_p2p_comm");
}

void nemoRecipe(RecipeArgs& r, const YAML::Node& root, std::vector<std::string>& ignored) {
  for (const auto& [key, node] : entries(r, root, "")) {
    if (key == "model") {
      if (!node.IsMap()) r.fail("model", "expected a map of model settings");
      nemoModel(r, node, ignored);
    } else if (key == "trainer" && node.IsMap()) {
      for (const auto& [sub, value] : entries(r, node, "trainer.")) {
        if (sub != "precision") {
          ignored.push_back("trainer." + sub);
          continue;
        }
        const std::string p = values(r, value, "trainer.precision").at(0);
        if (p == "bf16" || p == "bf16-mixed")
          r.add("--bf16", {}, "trainer.precision");
        else if (p == "16" || p == "16-mixed")
          r.add("--fp16", {}, "trainer.precision");
        else if (p != "32" && p != "32-true")
          r.fail("trainer.precision", "expected bf16, 16 or 32 (got '" + p + "')");
      }
      // Without bf16 or 16, the step is float32, which applyMegatronArgs refuses as for its arguments.
      r.origin.emplace("--bf16", "trainer.precision");
    } else {
      ignored.push_back(key);
    }
  }
}

}  // namespace

void applyRecipe(Workload& w, const std::string& text, const std::string& where, std::vector<std::string>& ignored) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(ErrorCode::ParseError, where + ": line " + std::to_string(e.mark.line + 1) + ": not YAML (" + e.msg +
                                           "); expected a Megatron-LM or NeMo recipe");
  }
  if (!root.IsMap())
    throw Error(ErrorCode::ParseError, where + ": expected a map of settings (a Megatron-LM or NeMo recipe)");
  RecipeArgs r{where, {}, {}};
  std::vector<std::string> skipped;
  if (root["model"] && root["model"].IsMap())
    nemoRecipe(r, root, skipped);
  else
    megatronYaml(r, root, skipped);

  std::string argText;
  for (const auto& [arg, vals] : r.args) {
    argText += arg;
    for (const std::string& v : vals) argText += " " + v;
    argText += "\n";
  }
  std::vector<std::string> megatronIgnored;
  try {
    applyMegatronArgs(w, argText, where, megatronIgnored);
  } catch (const Error& e) {
    // applyMegatronArgs names the argument ("where: --seq-length: ..."); name the recipe's key instead.
    const std::string head = where + ": ";
    const std::string msg = e.message();
    const std::size_t end = msg.find(": ", head.size());
    const auto it = msg.rfind(head, 0) == 0 && end != std::string::npos
                        ? r.origin.find(msg.substr(head.size(), end - head.size()))
                        : r.origin.end();
    if (e.code() != ErrorCode::ParseError || it == r.origin.end()) throw;
    throw Error(e.code(), head + it->second + msg.substr(end));
  }
  for (const std::string& arg : megatronIgnored) ignored.push_back(r.origin.count(arg) ? r.origin.at(arg) : arg);
  ignored.insert(ignored.end(), skipped.begin(), skipped.end());
}

}  // namespace mk

// Tests of reading the configs users have: Hugging Face config.json and Megatron-LM arguments, every mapping on a
// small inline config, and unknown or inexpressible keys and arguments named in the error.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "mk/error.hpp"
#include "mk/workload/workload_import.hpp"

using namespace mk;
using mk::test::expectError;

namespace {

Workload fromHf(const std::string& text, std::vector<std::string>* ignored = nullptr) {
  Workload w = workloadPreset("llama3-8b");
  w.layout = ParallelLayout{};  // the small models split over no GPU
  std::vector<std::string> dropped;
  applyHfConfig(w, text, "config.json", ignored ? *ignored : dropped);
  return w;
}

Workload fromMegatron(const std::string& text, std::vector<std::string>* ignored = nullptr) {
  Workload w = workloadPreset("llama3-8b");
  std::vector<std::string> dropped;
  applyMegatronArgs(w, text, "args", ignored ? *ignored : dropped);
  return w;
}

}  // namespace

TEST_CASE("import: a Llama-style config.json maps every shape key, rope_theta and friends are listed, not read") {
  std::vector<std::string> ignored;
  const Workload w = fromHf(R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 704, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 48, "vocab_size": 1000, "tie_word_embeddings": true,
    "hidden_act": "silu", "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072})",
                            &ignored);
  const ModelShape& m = w.model;
  CHECK(m.layers == 4);
  CHECK(m.hidden == 256);
  CHECK(m.ffn == 704);
  CHECK(m.heads == 8);
  CHECK(m.kvHeads == 2);
  CHECK(m.headDim() == 48);
  CHECK(m.vocab == 1000);
  CHECK(m.tiedEmbeddings);
  CHECK(m.activation == Activation::SwiGlu);
  CHECK_FALSE(m.moe);
  CHECK(w.training.seq == 8192);  // max_position_embeddings is not the training sequence
  CHECK(ignored == std::vector<std::string>{"architectures", "max_position_embeddings", "model_type", "rms_norm_eps",
                                            "rope_theta", "torch_dtype"});
}

TEST_CASE("import: MoE, MLA, sliding-window and GPT-2 keys of config.json") {
  const Workload d = fromHf(R"({"model_type": "deepseek_v3", "num_hidden_layers": 4, "hidden_size": 256,
    "intermediate_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1000,
    "n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 64, "n_shared_experts": 1,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "q_lora_rank": 96, "kv_lora_rank": 64,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "tie_word_embeddings": false})");
  REQUIRE(d.model.moe);
  CHECK(d.model.moe->experts == 16);
  CHECK(d.model.moe->topK == 4);
  CHECK(d.model.moe->ffn == 64);
  CHECK(d.model.moe->sharedExperts == 1);
  CHECK(d.model.moe->firstDenseLayers == 1);
  REQUIRE(d.model.mla);
  CHECK(d.model.mla->qLoraRank == 96);
  CHECK(d.model.mla->kvLoraRank == 64);
  CHECK(d.model.mla->qkNopeHeadDim == 32);
  CHECK(d.model.mla->qkRopeHeadDim == 16);
  CHECK(d.model.mla->vHeadDim == 32);

  const Workload o = fromHf(R"({"model_type": "gpt_oss", "num_hidden_layers": 4, "hidden_size": 256,
    "intermediate_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000,
    "num_local_experts": 8, "experts_per_token": 2, "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]})");
  CHECK(o.model.moe->experts == 8);
  CHECK(o.model.moe->topK == 2);
  CHECK(o.model.slidingWindow == 128);
  CHECK(o.model.slidingPattern == std::vector<uint8_t>{1, 0, 1, 0});

  const Workload g = fromHf(R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "n_inner": null,
    "vocab_size": 50257, "activation_function": "gelu_new", "n_positions": 1024})");
  CHECK(g.model.layers == 2);
  CHECK(g.model.ffn == 512);
  CHECK(g.model.kvHeads == 4);
  CHECK(g.model.activation == Activation::Gelu);
  CHECK(g.model.tiedEmbeddings);
  const Workload n = fromHf(R"({"model_type": "nemotron", "num_hidden_layers": 2, "hidden_size": 128,
    "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
    "hidden_act": "relu2"})");
  CHECK(n.model.activation == Activation::SquaredRelu);
}

TEST_CASE("import: config.json keys that are unknown or not expressible exit as errors naming the key") {
  const std::string base = R"("num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256,
    "num_attention_heads": 4, "vocab_size": 1000)";
  auto bad = [&](const std::string& extra, const std::vector<std::string>& parts) {
    expectError([&] { fromHf("{" + base + ", " + extra + "}"); }, ErrorCode::ParseError, parts);
  };
  bad(R"("frobnicate": 3)", {"config.json: frobnicate: unknown key"});
  bad(R"("num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [0])",
      {"config.json: mlp_only_layers:", "not expressible"});
  bad(R"("num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 2)",
      {"config.json: decoder_sparse_step: only 1"});
  bad(R"("num_experts": 8)", {"config.json: num_experts: needs num_experts_per_tok"});
  bad(R"("kv_lora_rank": 64)", {"config.json: qk_nope_head_dim: missing"});
  bad(R"("hidden_act": "tanh")", {"config.json: hidden_act: expected silu"});
  bad(R"("layer_types": ["sliding_attention", "full_attention"])", {"config.json: layer_types:", "sliding_window"});
  expectError([] { fromHf(R"({"hidden_size": 128})"); }, ErrorCode::ParseError,
              {"config.json: missing key num_hidden_layers"});
}

TEST_CASE("import: Megatron-LM arguments become model, training and layout, with Megatron-LM's defaults") {
  std::vector<std::string> ignored;
  const Workload w = fromMegatron(R"(
    # a recipe, as a launcher script writes it
    --num-layers 8 --hidden-size 512 --ffn-hidden-size 1536 \
    --num-attention-heads 8 --group-query-attention --num-query-groups 2
    --seq-length 2048 --micro-batch-size 2 --global-batch-size 256
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
    --num-layers-per-virtual-pipeline-stage 2 --sequence-parallel --use-distributed-optimizer
    --recompute-granularity selective --recompute-modules core_attn layernorm
    --bf16 --swiglu --untie-embeddings-and-output-weights --vocab-size 32000 --make-vocab-size-divisible-by 64
    --overlap-grad-reduce --tp-comm-overlap --no-overlap-p2p-communication
    --lr 3e-4 --seed=1234 --data-path 0.5 a 0.5 b)",
                                  &ignored);
  const ModelShape& m = w.model;
  CHECK(m.layers == 8);
  CHECK(m.hidden == 512);
  CHECK(m.ffn == 1536);
  CHECK(m.heads == 8);
  CHECK(m.kvHeads == 2);
  CHECK(m.vocab == 32000);
  CHECK(m.vocabPadMultiple == 64);
  CHECK(m.activation == Activation::SwiGlu);
  CHECK_FALSE(m.tiedEmbeddings);
  CHECK(w.training.seq == 2048);
  CHECK(w.training.microBatch == 2);
  CHECK(w.training.globalBatch == 256);
  CHECK(w.training.dtype == DType::BFloat16);
  CHECK(w.training.recompute == Recompute::Selective);
  CHECK(recomputeModuleNames(w.training.recomputeModules) == std::vector<std::string>{"core_attn", "norms"});
  const ParallelLayout& l = w.layout;
  CHECK(l.tp == 2);
  CHECK(l.pp == 2);
  CHECK_FALSE(l.dp);
  CHECK(l.schedule == PipelineSchedule::Interleaved);
  CHECK(l.virtualStages == 2);  // 8 layers / (2 stages x 2 layers a chunk)
  CHECK(l.sp);
  CHECK(l.zero == 1);
  CHECK(l.overlapGradReduce);
  CHECK_FALSE(l.overlapParamGather);
  CHECK(l.tpCommOverlap);
  CHECK_FALSE(l.overlapPpComm);
  CHECK_FALSE(l.overlapMoeA2a);
  CHECK(ignored == std::vector<std::string>{"--lr", "--seed", "--data-path"});

  // Absent flags are Megatron-LM's defaults: GeLU, tied embeddings, no SP, no distributed optimizer, MoE top 2.
  const Workload d = fromMegatron(
      "--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128 "
      "--micro-batch-size 1 --global-batch-size 8 --vocab-size 1000 --bf16 "
      "--num-experts 4 --expert-model-parallel-size 2 --fp8-format hybrid "
      "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1");
  CHECK(d.model.ffn == 512);
  CHECK(d.model.activation == Activation::Gelu);
  CHECK(d.model.tiedEmbeddings);
  CHECK(d.model.moe->experts == 4);
  CHECK(d.model.moe->topK == 2);
  CHECK(d.layout.ep == 2);
  CHECK_FALSE(d.layout.sp);
  CHECK(d.layout.zero == 0);
  CHECK(d.training.fp8);
  CHECK(d.training.recompute == Recompute::Full);
  CHECK(d.model.headDim() == 32);  // hidden / heads without --kv-channels
  CHECK(fromMegatron("--num-layers 2 --hidden-size 128 --num-attention-heads 4 --kv-channels 64 --seq-length 128 "
                     "--micro-batch-size 1 --global-batch-size 8 --vocab-size 1000 --bf16")
            .model.headDim() == 64);
  CHECK_FALSE(d.layout.tpCommOverlap);
  CHECK(d.layout.overlapPpComm);  // Megatron-LM's default (interleaved schedules only)
  CHECK(
      fromMegatron("--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128 --micro-batch-size 1 "
                   "--global-batch-size 8 --vocab-size 1000 --bf16 --num-experts 4 --overlap-moe-expert-parallel-comm")
          .layout.overlapMoeA2a);
  // Expert tensor parallelism: Megatron-LM's default is the tensor-parallel size.
  const std::string moeTp2 =
      "--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128 --micro-batch-size 1 "
      "--global-batch-size 8 --vocab-size 1000 --bf16 --num-experts 4 --sequence-parallel "
      "--tensor-model-parallel-size 2";
  CHECK(fromMegatron(moeTp2).layout.etp == 2);
  CHECK(fromMegatron(moeTp2 + " --expert-tensor-parallel-size 1").layout.etp == 1);
  CHECK(d.layout.etp == 1);
}

TEST_CASE("import: Megatron-LM arguments that are unknown or not expressible exit as errors naming them") {
  const std::string base =
      "--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128 "
      "--micro-batch-size 1 --global-batch-size 8 --vocab-size 1000 --bf16 ";
  auto bad = [&](const std::string& extra, const std::vector<std::string>& parts) {
    expectError([&] { fromMegatron(base + extra); }, ErrorCode::ParseError, parts);
  };
  bad("--frobnicate 3", {"args: --frobnicate: unknown argument"});
  bad("--recompute-granularity full --recompute-method uniform --recompute-num-layers 2",
      {"args: --recompute-num-layers: uniform chunks of more than one layer are not expressible"});
  bad("--recompute-granularity full --recompute-method block --recompute-num-layers 1",
      {"args: --recompute-num-layers: recomputing only some layers"});
  bad("--recompute-granularity selective --recompute-modules mla_up_proj",
      {"args: --recompute-modules: 'mla_up_proj' is not expressible"});
  bad("--num-query-groups 2", {"args: --num-query-groups: needs --group-query-attention"});
  bad("--sequence-parallel yes", {"args: --sequence-parallel: takes no value"});
  bad("--tensor-model-parallel-size two", {"args: --tensor-model-parallel-size: expected a positive integer"});
  expectError([] { fromMegatron("--num-layers 2 --hidden-size 128 --num-attention-heads 4"); }, ErrorCode::ParseError,
              {"args: --bf16: missing"});
  expectError([] { fromMegatron("num-layers 2"); }, ErrorCode::ParseError, {"args: 'num-layers': expected"});
}

namespace {

Workload fromRecipe(const std::string& text, std::vector<std::string>* ignored = nullptr) {
  Workload w = workloadPreset("llama3-8b");
  std::vector<std::string> dropped;
  applyRecipe(w, text, "recipe.yaml", ignored ? *ignored : dropped);
  return w;
}

const char* kNemoRecipe = R"(name: megatron_gpt
trainer:
  devices: 8
  precision: bf16
exp_manager:
  name: run
model:
  micro_batch_size: 2
  global_batch_size: 64
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 2
  context_parallel_size: 2
  encoder_seq_length: 4096
  max_position_embeddings: ${.encoder_seq_length}
  num_layers: 8
  hidden_size: 1024
  ffn_hidden_size: 2816
  num_attention_heads: 16
  num_query_groups: 4
  make_vocab_size_divisible_by: 64
  share_embeddings_and_output_weights: False
  activation: swiglu
  normalization: rmsnorm
  sequence_parallel: True
  ub_tp_comm_overlap: True
  activations_checkpoint_granularity: selective
  fp8: True
  fp8_e4m3: False
  fp8_hybrid: True
  optim:
    name: distributed_fused_adam
    lr: 2e-4
    overlap_grad_sync: True
)";

}  // namespace

TEST_CASE("import: a NeMo recipe maps its model names through Megatron-LM's arguments, the rest is listed") {
  std::vector<std::string> ignored;
  const Workload w = fromRecipe(kNemoRecipe, &ignored);
  CHECK(w.model.layers == 8);
  CHECK(w.model.hidden == 1024);
  CHECK(w.model.ffn == 2816);
  CHECK(w.model.heads == 16);
  CHECK(w.model.kvHeads == 4);
  CHECK(w.model.vocabPadMultiple == 64);
  CHECK_FALSE(w.model.tiedEmbeddings);
  CHECK(w.model.activation == Activation::SwiGlu);
  CHECK(w.training.seq == 4096);
  CHECK(w.training.microBatch == 2);
  CHECK(w.training.globalBatch == 64);
  CHECK(w.training.dtype == DType::BFloat16);
  CHECK(w.training.fp8);
  CHECK(w.training.recompute == Recompute::Selective);
  CHECK(w.layout.tp == 2);
  CHECK(w.layout.pp == 2);
  CHECK(w.layout.cp == 2);
  CHECK(w.layout.sp);
  CHECK(w.layout.tpCommOverlap);
  CHECK(w.layout.zero == 1);
  CHECK(w.layout.overlapGradReduce);
  CHECK_FALSE(w.layout.overlapPpComm);  // NeMo's default: overlap_p2p_comm off
  for (const char* k : {"model.max_position_embeddings", "model.normalization", "model.optim.lr", "trainer.devices",
                        "exp_manager", "name"})
    CHECK_MESSAGE(std::find(ignored.begin(), ignored.end(), k) != ignored.end(), k << " not listed");
}

TEST_CASE("import: a NeMo recipe's unknown, inexpressible or float32 key exits naming its YAML path") {
  const std::string recipe = kNemoRecipe;
  auto with = [&](const std::string& from, const std::string& to) {
    std::string text = recipe;
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  expectError([&] { fromRecipe(with("  normalization: rmsnorm", "  foo_bar: 1")); }, ErrorCode::ParseError,
              "recipe.yaml: model.foo_bar: unknown key");
  expectError([&] { fromRecipe(with("activation: swiglu", "activation: geglu")); }, ErrorCode::ParseError,
              {"model.activation", "geglu"});
  expectError([&] { fromRecipe(with("precision: bf16", "precision: 32")); }, ErrorCode::ParseError,
              {"recipe.yaml: trainer.precision", "float32"});
  expectError([&] { fromRecipe(with("num_layers: 8", "num_layers: eight")); }, ErrorCode::ParseError,
              {"recipe.yaml: model.num_layers", "positive integer"});
  expectError([&] { fromRecipe(with("num_layers: 8", "num_layers: ${x}")); }, ErrorCode::ParseError,
              {"model.num_layers", "interpolation"});
  expectError([&] { fromRecipe(with("  hidden_size: 1024", "  hidden_size: 1024\n  hidden_size: 512")); },
              ErrorCode::ParseError, {"model.hidden_size", "twice"});
  expectError([&] { fromRecipe("model: [1\n"); }, ErrorCode::ParseError, {"recipe.yaml: line", "not YAML"});
}

TEST_CASE("import: a Megatron-LM YAML config is its argument list, sections flattened, booleans as flags") {
  std::vector<std::string> ignored;
  const Workload w = fromRecipe(R"(language_model:
  num_layers: 4
  hidden_size: 512
  num_attention_heads: 8
  num_query_groups: null
  ffn_hidden_size: null
  activation_func: swiglu
  gated_linear_unit: False
  num_moe_experts: 8
  moe_router_topk: 2
  layernorm_epsilon: 1.e-5
  recompute_granularity: null
model_parallel:
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 1
  expert_model_parallel_size: 4
  sequence_parallel: True
  tp_comm_overlap: False
  bf16: True
  fp16: False
  overlap_p2p_comm: False
micro_batch_size: 1
global_batch_size: 32
seq_length: 2048
vocab_size: 32000
untie_embeddings_and_output_weights: True
use_distributed_optimizer: True
lr: 2.5e-4
rampup_batch_size: [32, 32, 65324160]
)",
                                &ignored);
  CHECK(w.model.layers == 4);
  CHECK(w.model.hidden == 512);
  CHECK(w.model.heads == 8);
  CHECK(w.model.kvHeads == 8);
  CHECK(w.model.ffn == 4 * 512);
  CHECK(w.model.activation == Activation::SwiGlu);
  REQUIRE(w.model.moe);
  CHECK(w.model.moe->experts == 8);
  CHECK(w.model.vocab == 32000);
  CHECK_FALSE(w.model.tiedEmbeddings);
  CHECK(w.training.seq == 2048);
  CHECK(w.training.globalBatch == 32);
  CHECK(w.layout.tp == 2);
  CHECK(w.layout.ep == 4);
  CHECK(w.layout.sp);
  CHECK_FALSE(w.layout.tpCommOverlap);
  CHECK(w.layout.zero == 1);
  CHECK_FALSE(w.layout.overlapPpComm);
  for (const char* k : {"lr", "language_model.layernorm_epsilon", "rampup_batch_size"})
    CHECK_MESSAGE(std::find(ignored.begin(), ignored.end(), k) != ignored.end(), k << " not listed");
  expectError([&] { fromRecipe("model_parallel:\n  bf16: True\n  frobnicate: 3\n"); }, ErrorCode::ParseError,
              {"recipe.yaml: model_parallel.frobnicate: unknown argument"});
  expectError([&] { fromRecipe("language_model:\n  activation_func: relu\nbf16: True\n"); }, ErrorCode::ParseError,
              {"language_model.activation_func", "relu"});
}

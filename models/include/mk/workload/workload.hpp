// mkernel — one training step of a decoder-only transformer and the parallel layout it runs with
// (docs/planner.md). Pure data, checks and JSON: no CUDA, no SimGrid.
//
// A Workload is what a capacity planner is asked about: the model's shape (layers, hidden, FFN, heads, KV heads,
// vocabulary, optional mixture of experts), the training step (sequence length, micro- and global batch, element
// type, activation recomputation) and the layout (tensor, pipeline, data and expert parallelism, sequence
// parallelism, ZeRO stage and gradient buckets). The data-parallel degree may be left to the GPU count ("auto"),
// so that one workload can be swept from 8 to 8192 GPUs; resolveLayout() fixes it for one GPU count.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mk/schedule/types.hpp"

namespace mk {

/// Mixture of experts in the transformer layers' MLPs (absent = dense). Layer i (0-based, over the whole model)
/// is a MoE layer when i >= firstDenseLayers and i % layerFreq == 0 (Hugging Face's first_k_dense_replace and
/// moe_layer_freq, Megatron-LM's --moe-layer-freq); the other layers run the dense MLP of model.ffn.
struct MoeSpec {
  uint32_t experts = 0;           ///< routed experts per layer
  uint32_t topK = 0;              ///< experts each token is sent to
  uint64_t ffn = 0;               ///< intermediate size of one expert (0 = the model's ffn)
  uint32_t sharedExperts = 0;     ///< experts every token goes through (n_shared_experts), run as one MLP
  uint64_t sharedFfn = 0;         ///< intermediate size of one shared expert (0 = the routed experts' ffn)
  uint32_t firstDenseLayers = 0;  ///< the first layers run the dense MLP (first_k_dense_replace)
  uint32_t layerFreq = 1;         ///< every layerFreq-th layer is a MoE layer (moe_layer_freq)
  /// Routing (docs/planner.md, "Expert parallelism"): the busiest expert-parallel rank receives imbalance x the
  /// balanced share of the routed tokens (1: "balanced"; at most layout.ep, every token of its group); with
  /// capacityFactor c > 0 no rank keeps more than c x the balanced share, the rest is dropped (skips the experts).
  double imbalance = 1;
  double capacityFactor = 0;  ///< 0: no capacity limit (dropless)
  /// The busiest rank's routed tokens over the balanced share: min(imbalance, capacityFactor).
  double routedLoad() const noexcept {
    return capacityFactor > 0 && capacityFactor < imbalance ? capacityFactor : imbalance;
  }
};

/// Multi-head latent attention (DeepSeek-V2/V3; Hugging Face config names in parentheses). Queries and keys have
/// qkNopeHeadDim + qkRopeHeadDim dimensions per head, values vHeadDim; keys and values are up-projected per head
/// from a kvLoraRank latent, which is computed together with one shared rope key head.
struct MlaSpec {
  uint64_t qLoraRank = 0;      ///< query latent (q_lora_rank); 0 = queries projected directly from hidden
  uint64_t kvLoraRank = 0;     ///< key/value latent (kv_lora_rank)
  uint64_t qkNopeHeadDim = 0;  ///< query/key dimensions without rotary embedding (qk_nope_head_dim)
  uint64_t qkRopeHeadDim = 0;  ///< query/key dimensions with rotary embedding (qk_rope_head_dim)
  uint64_t vHeadDim = 0;       ///< value dimensions per head (v_head_dim)
};

/// The MLP's activation. The gated ones have gate and up projections (3 matrices), the others 2.
enum class Activation : uint8_t {
  SwiGlu,       ///< "swiglu": silu(gate) x up (Llama, Mixtral, DeepSeek, Qwen, gpt-oss)
  GeGlu,        ///< "geglu": gelu(gate) x up
  Gelu,         ///< "gelu" (GPT-3)
  SquaredRelu,  ///< "squared-relu": relu(x)^2 (Nemotron-4)
};

/// The model's shape, in the names of the public model configs (Hugging Face config.json in parentheses).
struct ModelShape {
  uint32_t layers = 0;   ///< transformer layers (num_hidden_layers)
  uint64_t hidden = 0;   ///< model width (hidden_size)
  uint64_t ffn = 0;      ///< MLP intermediate size (intermediate_size); of the dense layers of a MoE model
  uint32_t heads = 0;    ///< query heads (num_attention_heads)
  uint32_t kvHeads = 0;  ///< key/value heads (num_key_value_heads; = heads without GQA)
  uint64_t vocab = 0;    ///< vocabulary (vocab_size)
  Activation activation = Activation::SwiGlu;  ///< gated ones use RMSNorm, the others LayerNorm
  std::optional<MoeSpec> moe;
  uint64_t explicitHeadDim = 0;  ///< head_dim ("headDim" in JSON); 0 = hidden / heads
  bool tiedEmbeddings = false;   ///< the LM head reuses the embedding matrix (tie_word_embeddings)
  /// Megatron-LM's --make-vocab-size-divisible-by: the embedding, the LM head and the loss use the vocabulary
  /// padded to a multiple of vocabPadMultiple x tp (paddedVocab()).
  uint32_t vocabPadMultiple = 128;
  std::optional<MlaSpec> mla;  ///< multi-head latent attention instead of (grouped-query) multi-head attention
  uint64_t slidingWindow = 0;  ///< tokens a windowed layer's queries see (sliding_window); 0 = no windowed layer
  /// Which layers are windowed, repeated over the layers from layer 0: 1 = windowed, 0 = full attention. Empty
  /// with slidingWindow > 0: every layer. JSON "slidingWindowPattern": n (every n-th layer full) or a list.
  std::vector<uint8_t> slidingPattern;

  uint64_t headDim() const noexcept { return explicitHeadDim ? explicitHeadDim : heads ? hidden / heads : 0; }
  bool gated() const noexcept { return activation == Activation::SwiGlu || activation == Activation::GeGlu; }
};

/// Activation recomputation (Megatron-LM's --recompute-granularity): none, every layer's forward pass again in
/// the backward pass (full), or only the chosen modules (selective, --recompute-modules).
enum class Recompute : uint8_t { None, Full, Selective };

/// The modules selective recomputation re-runs in the backward pass (their activations are not kept;
/// docs/planner.md, "Recomputation"). Megatron-LM's default for selective is core_attn alone.
struct RecomputeModules {
  bool coreAttn = false;  ///< "core_attn": the attention kernel
  bool mlp = false;       ///< "mlp": the dense layers' MLP (up, activation, down and their TP collectives)
  bool moeAct = false;    ///< "moe_act": the experts' activation function
  bool norms = false;     ///< "norms" (Megatron-LM's "layernorm"): the two norms of every layer
  bool any() const noexcept { return coreAttn || mlp || moeAct || norms; }
};

/// Set the module `name` ("core_attn", "mlp", "moe_act", "norms"; Megatron-LM's "layernorm" = "norms") in `m`;
/// false for any other name.
bool setRecomputeModule(RecomputeModules& m, const std::string& name);
/// The chosen modules' names in that order, for JSON and reports.
std::vector<std::string> recomputeModuleNames(const RecomputeModules& m);

/// One optimizer step of training.
struct TrainingSpec {
  uint64_t seq = 0;               ///< tokens per sequence
  uint32_t microBatch = 0;        ///< sequences per micro-batch (per data-parallel replica)
  uint64_t globalBatch = 0;       ///< sequences per optimizer step, over all replicas
  DType dtype = DType::BFloat16;  ///< element type of weights and activations (what the GEMMs run in)
  /// training.dtype "fp8": Transformer Engine's recipe, the linear layers' GEMMs in float8_e4m3 forward and
  /// backward (per-tensor scales, bf16 outputs), everything else in `dtype` (then bfloat16); docs/planner.md.
  bool fp8 = false;
  Recompute recompute = Recompute::None;  ///< Full: the forward pass is run again in the backward pass
  RecomputeModules recomputeModules;      ///< Selective: which modules (at least one)
  /// Megatron-LM's gradient-accumulation fusion (its default): the weight-gradient GEMMs of the linear layers add
  /// into the fp32 main-gradient buffer (fp32 output read and written), and only the other parameters' gradients
  /// (embedding, norms) are added by a separate kernel per micro-batch. Off: every parameter's 16-bit gradient is
  /// written and then added into the buffer per micro-batch (`main_grad.add_(grad)`; 2 + 4 + 4 bytes a parameter).
  /// Mixed precision only: float32 training has no separate buffer.
  bool gradAccumFusion = true;
};

/// Pipeline schedule.
enum class PipelineSchedule : uint8_t { OneFOneB, Interleaved, GPipe };

/// Default gradient bucket (bytes): PyTorch DistributedDataParallel's documented default, bucket_cap_mb = 25.
inline constexpr uint64_t kDefaultBucketBytes = uint64_t{25} << 20;
/// The gradient bucket sizes a layout may ask for: 4 KiB to 1e6 MiB. No value stands for "the default", so a size
/// that rounds to nothing is an error instead of silently becoming 25 MiB.
inline constexpr uint64_t kMinBucketBytes = 4096;
inline constexpr uint64_t kMaxBucketBytes = uint64_t{1000000} << 20;

/// How context parallelism exchanges keys and values (docs/planner.md, "Context parallelism").
enum class CpCommType : uint8_t {
  P2p,        ///< ring of K/V blocks, overlapped with the attention blocks; causal zigzag load balancing
  AllGather,  ///< K/V all-gathered before attention, dK/dV reduce-scattered after (not overlapped)
  A2a,        ///< Ulysses: all-to-all of Q, K, V before and of the output after attention, heads split over cp
  A2aP2p,     ///< hierarchical: a2a inside groups of cpA2aSize ranks, ring across them
};

/// How the step is split over GPUs. Ranks are ordered as Megatron-LM's "tp-cp-ep-dp-pp": tensor-parallel
/// fastest, then context, then data, then pipeline stage:
///   rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i)).
/// With etp 1 the expert-parallel group is drawn from the dp x cp ranks of one TP index (ep consecutive (cp, dp)
/// indices) when ep divides dp x cp; otherwise, and always with etp > 1, from Megatron's expert grid etp-ep-edp-pp
/// over the same ranks (etp consecutive ranks split an expert, ep ranks at stride etp hold different experts).
struct ParallelLayout {
  uint32_t tp = 1;                          ///< tensor parallelism (Megatron: attention heads and MLP columns split)
  uint32_t pp = 1;                          ///< pipeline stages
  std::optional<uint32_t> dp;               ///< data-parallel replicas; empty = "auto": GPUs / (tp * cp * pp)
  uint32_t cp = 1;                          ///< context parallelism: every sequence split over cp ranks
  CpCommType cpCommType = CpCommType::P2p;  ///< Megatron-LM's --cp-comm-type (its default p2p)
  uint32_t cpA2aSize = 0;  ///< a2a+p2p: ranks of one a2a group (> 1, divides cp; required there, 0 otherwise)
  uint32_t ep = 1;         ///< expert parallelism (MoE only): experts split over ep ranks of the dp x cp group
  /// Expert tensor parallelism (Megatron-LM's --expert-tensor-parallel-size): each expert's columns split over etp
  /// ranks, the tokens they receive all-gathered over those ranks before the experts and reduce-scattered after
  /// (docs/planner.md, "Expert parallelism"). 1: whole experts on every rank.
  uint32_t etp = 1;
  bool sp = true;  ///< sequence parallelism: TP all-reduce becomes reduce-scatter + all-gather
  PipelineSchedule schedule = PipelineSchedule::OneFOneB;
  uint32_t virtualStages = 1;  ///< model chunks per GPU (Interleaved only; 1 otherwise)
  uint32_t zero = 1;           ///< ZeRO stage 0..3 (0: all-reduce gradients; 1, 2: reduce-scatter + all-gather)
  uint64_t bucketBytes = kDefaultBucketBytes;  ///< gradient bucket size in bytes, in [kMinBucketBytes, kMaxBucketBytes]
  DType gradDtype = DType::Float32;            ///< element type gradients are reduced in
  bool overlapGradReduce = true;               ///< gradient buckets reduced while the last backward pass runs
  bool overlapParamGather = false;             ///< ZeRO 1/2: the parameter all-gather overlaps the next forward pass
  /// Tensor-parallel communication overlapped with the GEMM next to it on the layered side (Megatron-LM's
  /// --tp-comm-overlap, Transformer Engine's userbuffers: the collective split into tp chunks pipelined with the
  /// GEMM's chunks). Off by default, as in Megatron-LM; needs sequence parallelism, as there.
  bool tpCommOverlap = false;
  /// The interleaved schedule's pipeline sends and receives overlapped with compute (Megatron-LM's
  /// overlap_p2p_comm, on by default; it applies to the interleaved schedule only).
  bool overlapPpComm = true;
  /// MoE: the expert-parallel all-to-alls of one micro-batch overlapped with the other micro-batch's compute
  /// (Megatron-LM's --overlap-moe-expert-parallel-comm, the combined 1F1B schedule; off by default).
  bool overlapMoeA2a = false;
  /// SMs a communication kernel holds while it runs beside compute (Transformer Engine's userbuffers default
  /// num_sm for pipelined overlap); the compute beside it slows down as the overlap model says.
  uint32_t overlapSms = 16;
};

/// A training step to plan.
struct Workload {
  std::string name;  ///< preset name or file stem
  ModelShape model;
  TrainingSpec training;
  ParallelLayout layout;
};

/// The layout with every degree fixed for one GPU count.
struct ResolvedLayout {
  uint32_t gpus = 0;
  uint32_t tp = 1, pp = 1, dp = 1, ep = 1;
  uint32_t cp = 1;            ///< context parallelism
  uint32_t etp = 1;           ///< expert tensor parallelism
  uint32_t edp = 1;           ///< expert data parallelism: tp x cp x dp / (etp x ep) ranks hold the same experts
  uint32_t microBatches = 1;  ///< per replica per step: globalBatch / (dp * microBatch)
  uint32_t virtualStages = 1;
  std::vector<uint32_t> stageLayers;  ///< transformer layers of each pipeline stage (the first ones get extras)
};

/// Names of the built-in workloads ("gpt3-175b", "llama3.1-8b", ..., "gpt-oss-120b"; docs/planner.md, "Presets").
std::vector<std::string> workloadPresets();
/// A built-in workload (model numbers from the public configs, docs/planner.md cites each); throws
/// Error(NotFound) listing the presets.
Workload workloadPreset(const std::string& name);
/// One line describing a preset's source, for --list-workloads and the report.
std::string workloadPresetSource(const std::string& name);

/// Check every field that does not depend on the GPU count; throws Error(InvalidArgument) naming the field
/// ("layout.tp 3 does not divide model.heads 64") and what was expected.
void validateWorkload(const Workload& w);

/// Fix the layout for `gpus` GPUs (world = tp x cp x dp x pp). Throws Error(InvalidArgument) naming the field when
/// the layout cannot run on that many GPUs (tp * cp * pp does not divide it, an explicit dp that gives another
/// world size, ep not dividing dp x cp (or tp x cp x dp), etp not dividing tp x cp x dp / ep, a global batch that
/// dp * microBatch does not divide). validateWorkload() first.
ResolvedLayout resolveLayout(const Workload& w, uint32_t gpus);

const char* toString(Recompute r) noexcept;         ///< "none", "full", "selective"
const char* toString(PipelineSchedule s) noexcept;  ///< "1f1b", "interleaved", "gpipe"
const char* toString(Activation a) noexcept;        ///< "swiglu", "geglu", "gelu", "squared-relu"
const char* toString(CpCommType c) noexcept;        ///< "p2p", "all-gather", "a2a", "a2a+p2p"

/// JSON ("mkernel.workload.v1", camelCase fields as the topology and profile files). Format: docs/planner.md.
std::string workloadToJson(const Workload& w, int indent = 2);
/// Parse and validate. A document with "preset" starts from that preset and every section and field is an
/// override; without it "model" and "training" are required whole. Throws Error(ParseError) naming the field
/// for malformed input, Error(InvalidArgument) from validateWorkload, Error(NotFound) for an unknown preset.
Workload workloadFromJson(const std::string& text);
/// A preset name or a path to a JSON file (errors name the file).
Workload loadWorkload(const std::string& presetOrPath);
/// Apply a layout JSON object ({"tp": 8, ...}: the "layout" section of a workload file) to `w`; throws like
/// workloadFromJson with field names prefixed by `where`.
void applyLayoutJson(Workload& w, const std::string& text, const std::string& where);

}  // namespace mk

// mkernel — what a model shape implies, layer by layer: which layers are MoE or windowed, the padded vocabulary
// and the parameters of each part (docs/planner.md, "Model shapes"). The lowering, the memory estimate and the
// workload checks all count parameters here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "mk/workload/workload.hpp"

namespace mk {

/// Megatron-LM's vocabulary padding: ceil(vocab / (vocabPadMultiple x tp)) x vocabPadMultiple x tp.
uint64_t paddedVocab(const ModelShape& m, uint32_t tp) noexcept;
/// Layer `layer` (0-based over the whole model) runs the routed experts (MoeSpec's rule).
bool isMoeLayer(const ModelShape& m, uint32_t layer) noexcept;
/// Layer `layer` attends over a sliding window (ModelShape::slidingPattern's rule).
bool isWindowedLayer(const ModelShape& m, uint32_t layer) noexcept;
/// Keys summed over the queries of one causal sequence of `seq` tokens when each query sees at most `window`
/// keys (0 = no window): s w - w^2 / 2 with w = min(s, window), s^2 / 2 without a window.
double causalKeys(uint64_t seq, uint64_t window) noexcept;

/// Parameters of one transformer layer on one GPU at tensor parallelism `tp` (the parts split by TP divided,
/// the replicated ones whole: MLA's down-projections, norms, the router; experts are not split by TP).
struct LayerParams {
  double attention = 0;    ///< projections (q, k, v or MLA's), output projection, MLA's latent norms
  double norms = 0;        ///< the two norm weight vectors around attention and the MLP
  double mlp = 0;          ///< the dense MLP (model.ffn) of a dense layer
  double shared = 0;       ///< a MoE layer's shared experts
  double router = 0;       ///< a MoE layer's router
  double expert = 0;       ///< one routed expert
  double latentNorms = 0;  ///< MLA's q / kv latent norm weights (inside `attention`)
};
LayerParams layerParams(const ModelShape& m, uint32_t tp) noexcept;

/// Parameters of the whole model (the configured vocabulary, unpadded; tied embeddings counted once): all of
/// them, and those one token goes through (the dense ones and topK routed experts per MoE layer).
struct ParamCount {
  double total = 0;
  double active = 0;
};
ParamCount countParams(const ModelShape& m) noexcept;

/// "swiglu", "geglu", "gelu", "squared-relu", or nothing.
std::optional<Activation> parseActivation(const std::string& s);

/// Check the model fields of the shapes above (MLA, sliding window, activation, vocabulary padding, the MoE
/// layout); throws Error(InvalidArgument) naming the field. Called by validateWorkload.
void validateModelShape(const ModelShape& m);

}  // namespace mk

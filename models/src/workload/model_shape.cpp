// mkernel — layer kinds, padded vocabulary and parameter counts of a model shape (model_shape.hpp).
#include "mk/workload/model_shape.hpp"

#include <algorithm>
#include <vector>

#include "mk/error.hpp"

namespace mk {

namespace {

[[noreturn]] void bad(const std::string& msg) { throw Error(ErrorCode::InvalidArgument, msg); }

std::string str(uint64_t v) { return std::to_string(v); }

double dbl(uint64_t v) { return static_cast<double>(v); }

/// Intermediate size of one routed expert.
uint64_t expertFfn(const ModelShape& m) { return m.moe && m.moe->ffn ? m.moe->ffn : m.ffn; }

/// Intermediate size of the shared experts together (one MLP).
uint64_t sharedWidth(const ModelShape& m) {
  if (!m.moe || m.moe->sharedExperts == 0) return 0;
  return uint64_t{m.moe->sharedExperts} * (m.moe->sharedFfn ? m.moe->sharedFfn : expertFfn(m));
}

}  // namespace

uint64_t paddedVocab(const ModelShape& m, uint32_t tp) noexcept {
  const uint64_t unit = uint64_t{std::max<uint32_t>(1, m.vocabPadMultiple)} * std::max<uint32_t>(1, tp);
  return (m.vocab + unit - 1) / unit * unit;
}

bool isMoeLayer(const ModelShape& m, uint32_t layer) noexcept {
  if (!m.moe) return false;
  return layer >= m.moe->firstDenseLayers && layer % std::max<uint32_t>(1, m.moe->layerFreq) == 0;
}

bool isWindowedLayer(const ModelShape& m, uint32_t layer) noexcept {
  if (m.slidingWindow == 0) return false;
  if (m.slidingPattern.empty()) return true;
  return m.slidingPattern[layer % m.slidingPattern.size()] != 0;
}

double causalKeys(uint64_t seq, uint64_t window) noexcept {
  const double s = dbl(seq), w = window == 0 ? s : std::min(s, dbl(window));
  return s * w - w * w / 2;
}

LayerParams layerParams(const ModelShape& m, uint32_t tp) noexcept {
  LayerParams p;
  const double h = dbl(m.hidden), a = dbl(m.heads / tp), mats = m.gated() ? 3.0 : 2.0;
  if (m.mla) {
    const MlaSpec& x = *m.mla;
    const double qk = dbl(x.qkNopeHeadDim + x.qkRopeHeadDim);
    // The down-projections (and their latent norms) are replicated over TP, the up-projections split by heads.
    const double q = x.qLoraRank ? h * dbl(x.qLoraRank) + dbl(x.qLoraRank) * a * qk : h * a * qk;
    const double kv =
        h * dbl(x.kvLoraRank + x.qkRopeHeadDim) + dbl(x.kvLoraRank) * a * dbl(x.qkNopeHeadDim + x.vHeadDim);
    p.latentNorms = dbl(x.qLoraRank + x.kvLoraRank);
    p.attention = q + kv + p.latentNorms + a * dbl(x.vHeadDim) * h;
  } else {
    const double d = dbl(m.headDim()), kv = dbl(std::max<uint64_t>(1, m.kvHeads / tp));
    p.attention = h * (a + 2 * kv) * d + a * d * h;
  }
  p.norms = 2 * h;
  p.mlp = mats * h * dbl(m.ffn / tp);
  if (m.moe) {
    p.shared = mats * h * dbl(sharedWidth(m) / tp);
    p.router = h * m.moe->experts;
    p.expert = mats * h * dbl(expertFfn(m));
  }
  return p;
}

ParamCount countParams(const ModelShape& m) noexcept {
  const LayerParams p = layerParams(m, 1);
  ParamCount c;
  for (uint32_t i = 0; i < m.layers; ++i) {
    const double base = p.attention + p.norms;
    if (isMoeLayer(m, i)) {
      c.total += base + p.shared + p.router + m.moe->experts * p.expert;
      c.active += base + p.shared + p.router + m.moe->topK * p.expert;
    } else {
      c.total += base + p.mlp;
      c.active += base + p.mlp;
    }
  }
  const double vocab = dbl(m.vocab) * dbl(m.hidden) * (m.tiedEmbeddings ? 1 : 2) + dbl(m.hidden);  // + final norm
  c.total += vocab;
  c.active += vocab;
  return c;
}

std::optional<Activation> parseActivation(const std::string& s) {
  for (Activation a : {Activation::SwiGlu, Activation::GeGlu, Activation::Gelu, Activation::SquaredRelu})
    if (s == toString(a)) return a;
  return std::nullopt;
}

const char* toString(Activation a) noexcept {
  switch (a) {
    case Activation::SwiGlu: return "swiglu";
    case Activation::GeGlu: return "geglu";
    case Activation::Gelu: return "gelu";
    case Activation::SquaredRelu: return "squared-relu";
  }
  return "swiglu";
}

void validateModelShape(const ModelShape& m) {
  if (m.vocabPadMultiple == 0) bad("model.vocabPadMultiple must be >= 1 (got 0; 1 = no padding)");
  // Head and latent dimensions are summed and multiplied by head and token counts in 64 bits: bound them so that
  // no sum or product wraps (the parameter bound of validateWorkload then refuses what is merely too large).
  constexpr uint64_t kMaxDim = uint64_t{1} << 32;
  std::vector<std::pair<const char*, uint64_t>> dims = {{"model.headDim", m.explicitHeadDim}};
  if (m.mla)
    dims.insert(dims.end(), {{"model.mla.qLoraRank", m.mla->qLoraRank},
                             {"model.mla.kvLoraRank", m.mla->kvLoraRank},
                             {"model.mla.qkNopeHeadDim", m.mla->qkNopeHeadDim},
                             {"model.mla.qkRopeHeadDim", m.mla->qkRopeHeadDim},
                             {"model.mla.vHeadDim", m.mla->vHeadDim}});
  if (m.moe) dims.emplace_back("model.moe.sharedFfn", m.moe->sharedFfn);
  for (const auto& [field, v] : dims)
    if (v > kMaxDim) bad(std::string(field) + " must be at most 4294967296 (got " + str(v) + ")");
  const uint64_t sharedFfn = m.moe ? (m.moe->sharedFfn ? m.moe->sharedFfn : expertFfn(m)) : 0;
  if (m.moe && dbl(m.moe->sharedExperts) * dbl(sharedFfn) > dbl(kMaxDim))
    bad("model.moe.sharedExperts x model.moe.sharedFfn must be at most 4294967296 (got " + str(m.moe->sharedExperts) +
        " x " + str(sharedFfn) + ")");
  if (m.mla) {
    const MlaSpec& x = *m.mla;
    const std::pair<const char*, uint64_t> required[] = {{"model.mla.kvLoraRank", x.kvLoraRank},
                                                         {"model.mla.qkNopeHeadDim", x.qkNopeHeadDim},
                                                         {"model.mla.qkRopeHeadDim", x.qkRopeHeadDim},
                                                         {"model.mla.vHeadDim", x.vHeadDim}};
    for (const auto& [field, v] : required)
      if (v == 0) bad(std::string(field) + " must be > 0 (got 0)");
    if (m.explicitHeadDim != 0)
      bad("model.headDim " + str(m.explicitHeadDim) +
          " conflicts with model.mla (its head dims are model.mla.qkNopeHeadDim + qkRopeHeadDim and vHeadDim): "
          "remove model.headDim");
    if (m.kvHeads != m.heads)
      bad("model.kvHeads " + str(m.kvHeads) + " conflicts with model.mla: latent attention has one key/value head " +
          "per query head (set model.kvHeads to model.heads " + str(m.heads) + ")");
  } else if (m.explicitHeadDim == 0 && m.heads != 0 && m.hidden % m.heads != 0) {
    bad("model.heads " + str(m.heads) + " does not divide model.hidden " + str(m.hidden) +
        " (the head dimension is hidden / heads; set model.headDim)");
  }
  if (!m.slidingPattern.empty()) {
    if (m.slidingWindow == 0) bad("model.slidingWindowPattern needs model.slidingWindow > 0");
    if (m.slidingPattern.size() > m.layers)
      bad("model.slidingWindowPattern has " + str(m.slidingPattern.size()) + " entries, more than model.layers " +
          str(m.layers));
  }
  if (m.moe) {
    const MoeSpec& e = *m.moe;
    if (e.layerFreq == 0) bad("model.moe.layerFreq must be >= 1 (got 0; 1 = every layer is a MoE layer)");
    if (e.firstDenseLayers >= m.layers)
      bad("model.moe.firstDenseLayers " + str(e.firstDenseLayers) + " leaves no MoE layer of model.layers " +
          str(m.layers) + " (remove model.moe for a dense model)");
    if (e.sharedFfn != 0 && e.sharedExperts == 0)
      bad("model.moe.sharedFfn " + str(e.sharedFfn) + " needs model.moe.sharedExperts >= 1");
  }
}

}  // namespace mk

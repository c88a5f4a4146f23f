// mkernel — the attention engine's shape checks and work parameters (mk/attention_params.hpp): no CUDA.
#include "mk/attention_params.hpp"

#include <string>

namespace mk {
namespace {

constexpr uint64_t kMaxPosition = uint64_t{1} << 62;  // qPos - kvPos stays a signed 64-bit difference

}  // namespace

std::string attentionForwardProblem(const AttentionShape& sh, DType dtype) {
  std::string why = attentionShapeProblem(sh);
  if (!why.empty()) return why;
  auto s = [](uint64_t v) { return std::to_string(v); };
  if (sh.headDim != 64 && sh.headDim != 128)
    return "headDim " + s(sh.headDim) + " is not supported by the GPU attention engine (64 or 128)";
  if (dtype != DType::BFloat16) return "dtype: the GPU attention engine reads bf16 Q, K and V only";
  if (sh.vOffset % 8 != 0)
    return "vOffset " + s(sh.vOffset) + " is not a multiple of 8 elements (TMA needs V 16-byte aligned)";
  // TMA: coordinates are int32 (a tile may start up to 127 rows before the end), strides below 2^40 bytes.
  if (sh.sq > (1u << 30) || sh.skv > (1u << 30)) return "sq and skv must be <= 2^30 (TMA coordinates)";
  const uint64_t maxLd = sh.ldq > sh.ldkv ? sh.ldq : sh.ldkv;
  if (maxLd * uint64_t{sh.qHeads} * sh.headDim * 2 >= (uint64_t{1} << 40))
    return "ldq / ldkv x heads x headDim x 2 bytes must be < 2^40 (TMA strides)";
  if (sh.qPos >= kMaxPosition || sh.kvPos >= kMaxPosition) return "qPos and kvPos must be < 2^62";
  const uint64_t units = uint64_t{sh.batch} * sh.qHeads * ((uint64_t{sh.sq} + 127) / 128);
  if (units >= (uint64_t{1} << 31)) return "batch x qHeads x ceil(sq / 128) must be < 2^31 (work units)";
  return "";
}

device::AttentionParams attentionWorkParams(const AttentionShape& sh) {
  device::AttentionParams p;
  p.batch = sh.batch;
  p.qHeads = sh.qHeads;
  p.kvHeads = sh.kvHeads;
  p.headDim = sh.headDim;
  p.sq = sh.sq;
  p.skv = sh.skv;
  p.ldo = sh.ldo;
  p.qTiles = (sh.sq + 127) / 128;
  p.units = sh.batch * sh.qHeads * p.qTiles;
  p.causal = sh.causal ? 1 : 0;
  p.causalDelta = static_cast<int64_t>(sh.qPos) - static_cast<int64_t>(sh.kvPos);
  p.scale = sh.scale;
  p.scaleLog2 = static_cast<float>(static_cast<double>(sh.scale) * 1.4426950408889634);
  return p;
}

}  // namespace mk

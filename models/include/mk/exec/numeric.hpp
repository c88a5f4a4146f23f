// mkernel — element conversions and reductions shared by the CPU executor, references and tests.
#pragma once

#include <cstdint>
#include <cstring>

#include "mk/schedule/types.hpp"

namespace mk {

/// float -> bfloat16 bits, round to nearest even; NaN stays NaN.
uint16_t floatToBf16(float f) noexcept;
float bf16ToFloat(uint16_t h) noexcept;
/// float -> IEEE binary16 bits, round to nearest even, overflow to inf; NaN stays NaN.
uint16_t floatToHalf(float f) noexcept;
float halfToFloat(uint16_t h) noexcept;
/// float -> OCP FP8 E4M3 bits (bias 7, max 448, no inf, S.1111.111 the only NaN), round to nearest even; past
/// 448 (after rounding) and +-inf become NaN (the spec's non-saturating conversion); NaN stays NaN.
uint8_t floatToE4m3(float f) noexcept;
float e4m3ToFloat(uint8_t h) noexcept;
/// float -> OCP FP8 E5M2 bits (bias 15, IEEE-like: max 57344, inf, NaNs), round to nearest even, overflow to inf;
/// NaN stays NaN (its top two payload bits kept).
uint8_t floatToE5m2(float f) noexcept;
float e5m2ToFloat(uint8_t h) noexcept;

/// float -> int32, round to nearest even, saturating at the int32 range; NaN gives 0. What storeElement does for an
/// int32 buffer (no step rounds into one: Reduce and GEMM refuse integer operands; verifiers and tests may).
int32_t floatToInt32(float f) noexcept;

/// Element `i` of a buffer of type `t` as float (int32: exact up to 2^24 in magnitude).
float loadElement(DType t, const void* base, uint64_t i) noexcept;
/// Store `v` rounded to `t` as element `i`.
void storeElement(DType t, void* base, uint64_t i, float v) noexcept;
/// op(a, b) in float, for the element-wise operators (redOpInfo(op).shape == RedOpShape::Elementwise).
float applyRedOp(RedOp op, float a, float b) noexcept;

/// SwiGLU of one (gate, up) pair in float: silu(gate) x up = gate / (1 + e^-gate) x up (the kStepSwiGLU epilogue).
float swiglu(float gate, float up) noexcept;

/// Elements of a buffer from element `offset` on: the operands of a row operator.
struct ElementRange {
  DType type;
  void* base;
  uint64_t offset;
};

/// The weights of one log-sum-exp merge (ring attention's online-softmax combine, FlashAttention-2 §3.1): for
/// partial results (o1, lse1) and (o2, lse2), lse = max + log(exp(lse1 - max) + exp(lse2 - max)) and
/// o = o1 * exp(lse1 - lse) + o2 * exp(lse2 - lse) = o1 * w1 + o2 * w2. A partial over no keys (lse = -inf)
/// weighs 0; two of them give lse = -inf and o = 0. A NaN lse makes the row NaN.
struct LseWeights {
  float lse, w1, w2;
};
LseWeights lseMergeWeights(float lse1, float lse2) noexcept;

/// dst <- lse-merge(a, b) over `rows` rows of `width` values followed by their log-sum-exp, in float, each
/// element rounded once to dst's type. dst may alias a or b exactly (a row's inputs are read before it is
/// written).
void lseMergeRows(const ElementRange& dst, const ElementRange& a, const ElementRange& b, uint64_t rows,
                  uint32_t width) noexcept;

}  // namespace mk

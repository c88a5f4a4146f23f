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

/// Element `i` of a buffer of type `t` as float.
float loadElement(DType t, const void* base, uint64_t i) noexcept;
/// Store `v` rounded to `t` as element `i`.
void storeElement(DType t, void* base, uint64_t i, float v) noexcept;
/// op(a, b) in float.
float applyRedOp(RedOp op, float a, float b) noexcept;

}  // namespace mk

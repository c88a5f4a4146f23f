// mkernel — element conversions and reductions shared by the CPU executor, references and tests.
//
// The conversions are written with integer arithmetic on the bit patterns so they do not depend on the
// floating-point environment (rounding mode, flush-to-zero) of whoever calls them: the executor is the
// oracle, and its rounding must be exactly round-to-nearest-even everywhere.
#include "mk/exec/numeric.hpp"

#include <cmath>

namespace mk {
namespace {

uint32_t floatBits(float f) noexcept {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bitsToFloat(uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

constexpr uint32_t kF32AbsMask = 0x7fffffffu;
constexpr uint32_t kF32Inf = 0x7f800000u;
constexpr uint32_t kF32QuietBit = 0x00400000u;

}  // namespace

uint16_t floatToBf16(float f) noexcept {
  const uint32_t u = floatBits(f);
  if ((u & kF32AbsMask) > kF32Inf) {
    // Keep sign and the top payload bits; setting the quiet bit guarantees the truncated payload is
    // never all-zero (which would turn the NaN into an infinity).
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  // Round to nearest even on the 16 dropped bits; a carry out of the mantissa correctly bumps the
  // exponent, and past the largest finite value it lands exactly on infinity.
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

float bf16ToFloat(uint16_t h) noexcept {
  // Widening is exact; NaN payloads (signalling or not) are kept bit for bit.
  return bitsToFloat(static_cast<uint32_t>(h) << 16);
}

uint16_t floatToHalf(float f) noexcept {
  const uint32_t u = floatBits(f);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & kF32AbsMask;
  if (a > kF32Inf) {  // NaN: quiet, keep the top 9 payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x01ffu));
  }
  // 65520 = 65504 + half an ulp: a tie, and 65504's mantissa is odd, so it and everything above
  // rounds to infinity.
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {                   // >= 2^-14: a normal half
    const uint32_t exp = (a >> 23) - 112u;  // rebias 127 -> 15
    const uint32_t mant = a & 0x007fffffu;
    uint32_t h = (exp << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is correct
    return static_cast<uint16_t>(sign | h);
  }
  // Subnormal half (or zero): the result is round(|f| / 2^-24) units of the smallest subnormal.
  const uint32_t exp = a >> 23;
  if (exp < 102u) return sign;  // |f| < 2^-25: below half the smallest subnormal, rounds to zero
  const uint32_t mant = (a & 0x007fffffu) | 0x00800000u;  // value = mant * 2^(exp - 150)
  const uint32_t shift = 126u - exp;                      // 14 .. 24
  uint32_t h = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rest > halfway || (rest == halfway && (h & 1u))) ++h;  // may carry into the smallest normal: correct
  return static_cast<uint16_t>(sign | h);
}

float halfToFloat(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x03ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in float.
    const float mag = static_cast<float>(mant) * 0x1p-24f;
    return std::copysign(mag, sign ? -1.0f : 1.0f);
  }
  if (exp == 0x1fu) {
    if (mant == 0) return bitsToFloat(sign | kF32Inf);
    return bitsToFloat(sign | kF32Inf | kF32QuietBit | (mant << 13));
  }
  return bitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

float loadElement(DType t, const void* base, uint64_t i) noexcept {
  const auto* bytes = static_cast<const unsigned char*>(base);
  switch (t) {
    case DType::Float32: {
      float f;
      std::memcpy(&f, bytes + i * 4, sizeof f);
      return f;
    }
    case DType::BFloat16: {
      uint16_t h;
      std::memcpy(&h, bytes + i * 2, sizeof h);
      return bf16ToFloat(h);
    }
    case DType::Float16: {
      uint16_t h;
      std::memcpy(&h, bytes + i * 2, sizeof h);
      return halfToFloat(h);
    }
  }
  return 0.0f;
}

void storeElement(DType t, void* base, uint64_t i, float v) noexcept {
  auto* bytes = static_cast<unsigned char*>(base);
  switch (t) {
    case DType::Float32: std::memcpy(bytes + i * 4, &v, sizeof v); return;
    case DType::BFloat16: {
      const uint16_t h = floatToBf16(v);
      std::memcpy(bytes + i * 2, &h, sizeof h);
      return;
    }
    case DType::Float16: {
      const uint16_t h = floatToHalf(v);
      std::memcpy(bytes + i * 2, &h, sizeof h);
      return;
    }
  }
}

float applyRedOp(RedOp op, float a, float b) noexcept {
  switch (op) {
    case RedOp::Sum: return a + b;
    case RedOp::Max:
    case RedOp::Min: {
      // NaN propagates (a NaN in the data must never be hidden by a reduction), and +0/-0 are ordered
      // (max(+0,-0) = +0, min = -0) so the result does not depend on the order ranks are combined in.
      if (std::isnan(a)) return a;
      if (std::isnan(b)) return b;
      if (a == b) {
        const bool aNeg = std::signbit(a);
        if (op == RedOp::Max) return aNeg ? b : a;
        return aNeg ? a : b;
      }
      if (op == RedOp::Max) return a > b ? a : b;
      return a < b ? a : b;
    }
  }
  return a;
}

}  // namespace mk

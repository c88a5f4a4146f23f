// mkernel — element conversions and reductions shared by the CPU executor, references and tests.
//
// The conversions are written with integer arithmetic on the bit patterns so they do not depend on the
// floating-point environment (rounding mode, flush-to-zero) of whoever calls them: the executor is the
// oracle, and its rounding must be exactly round-to-nearest-even everywhere.
#include "mk/exec/numeric.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

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

namespace {

/// float -> an 8-bit float of `fmt` (float8_e4m3 or float8_e5m2), round to nearest even. A value past the
/// largest finite one after rounding overflows to inf (e5m2) or to NaN (e4m3, which has no inf): the OCP FP8
/// spec's non-saturating conversion, the analogue of floatToHalf's.
uint8_t floatToFp8(float f, const DTypeInfo& fmt) noexcept {
  const uint32_t u = floatBits(f);
  const auto sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & kF32AbsMask;
  const uint32_t m = fmt.mantissaBits;
  const uint32_t expMask = (1u << fmt.exponentBits) - 1u;
  const auto nan = static_cast<uint8_t>(sign | (expMask << m) | ((1u << m) - 1u));  // e4m3's only NaN; e5m2's
  const auto inf = static_cast<uint8_t>(sign | (expMask << m));
  if (a > kF32Inf) {
    if (!fmt.infinities) return nan;
    // e5m2: keep the top payload bits; all-zero would read as inf, so the quiet bit stands in for them.
    const uint32_t payload = (a >> (23u - m)) & ((1u << m) - 1u);
    return static_cast<uint8_t>(inf | (payload != 0 ? payload : 1u << (m - 1u)));
  }
  if (a == kF32Inf) return fmt.infinities ? inf : nan;
  // |f| = mant * 2^(e - 150) with a 24-bit mant (float subnormals: e = 1 and no implicit bit).
  const uint32_t e = a >> 23;
  const uint32_t mant = e == 0 ? a : (a & 0x007fffffu) | 0x00800000u;
  const int32_t exp = e == 0 ? 1 : static_cast<int32_t>(e);
  // The quantum of the target binade: 2^(max(E, 1 - bias) - m), E = exp - 127 the value's own exponent.
  const int32_t minExp = 1 - static_cast<int32_t>(fmt.bias);
  const int32_t quantumExp = std::max(exp - 127, minExp) - static_cast<int32_t>(m);
  // At least 23 - m > 0: an 8-bit float's quantum is always coarser than the float's.
  const int32_t shift = quantumExp - (exp - 150);
  uint32_t n = 0;  // |f| in quanta, rounded to nearest even
  if (shift < 25) {
    n = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (n & 1u))) ++n;
  }  // else |f| < half the smallest subnormal: zero
  // n includes the implicit bit, so one sum encodes normals, subnormals and a carry into the next binade.
  const int64_t code =
      (static_cast<int64_t>(quantumExp) + static_cast<int64_t>(m) + fmt.bias - 1) * (int64_t{1} << m) + n;
  const uint32_t maxFiniteCode = fmt.infinities ? (expMask << m) - 1u : (expMask << m) | ((1u << m) - 2u);
  if (n == 0) return sign;
  if (code > static_cast<int64_t>(maxFiniteCode)) return fmt.infinities ? inf : nan;
  return static_cast<uint8_t>(sign | static_cast<uint32_t>(code));
}

float fp8ToFloat(uint8_t h, const DTypeInfo& fmt) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x80u) << 24;
  const uint32_t m = fmt.mantissaBits;
  const uint32_t expMask = (1u << fmt.exponentBits) - 1u;
  const uint32_t exp = (h >> m) & expMask;
  const uint32_t mant = h & ((1u << m) - 1u);
  if (!fmt.infinities && exp == expMask && mant == (1u << m) - 1u) return bitsToFloat(sign | kF32Inf | kF32QuietBit);
  if (fmt.infinities && exp == expMask) {
    if (mant == 0) return bitsToFloat(sign | kF32Inf);
    return bitsToFloat(sign | kF32Inf | (mant << (23u - m)));  // payload kept bit for bit (it is never zero)
  }
  if (exp == 0) {
    // Zero or subnormal: mant * 2^(1 - bias - m) is exact in float.
    const float mag = std::ldexp(static_cast<float>(mant), 1 - static_cast<int>(fmt.bias) - static_cast<int>(m));
    return std::copysign(mag, sign ? -1.0f : 1.0f);
  }
  return bitsToFloat(sign | ((exp + 127u - fmt.bias) << 23) | (mant << (23u - m)));
}

}  // namespace

int32_t floatToInt32(float f) noexcept {
  if (std::isnan(f)) return 0;
  // 2^31 is exact in float; every float at or above it (or at or below -2^31) saturates.
  if (f >= 2147483648.0f) return std::numeric_limits<int32_t>::max();
  if (f <= -2147483648.0f) return std::numeric_limits<int32_t>::min();
  // |f| < 2^31: its integer part and the fraction are exact in float (a float of magnitude >= 2^23 has no
  // fraction), so the tie test below is exact and needs no rounding mode.
  const float whole = std::trunc(f);
  const float frac = std::fabs(f - whole);
  auto n = static_cast<int64_t>(whole);
  const bool odd = (n & 1) != 0;
  if (frac > 0.5f || (frac == 0.5f && odd)) n += f < 0 ? -1 : 1;
  return static_cast<int32_t>(
      std::clamp<int64_t>(n, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()));
}

uint8_t floatToE4m3(float f) noexcept { return floatToFp8(f, dtypeInfo(DType::Float8E4M3)); }
float e4m3ToFloat(uint8_t h) noexcept { return fp8ToFloat(h, dtypeInfo(DType::Float8E4M3)); }
uint8_t floatToE5m2(float f) noexcept { return floatToFp8(f, dtypeInfo(DType::Float8E5M2)); }
float e5m2ToFloat(uint8_t h) noexcept { return fp8ToFloat(h, dtypeInfo(DType::Float8E5M2)); }

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
    case DType::Float8E4M3: return e4m3ToFloat(bytes[i]);
    case DType::Float8E5M2: return e5m2ToFloat(bytes[i]);
    case DType::Int32: {
      int32_t v;
      std::memcpy(&v, bytes + i * 4, sizeof v);
      return static_cast<float>(v);
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
    case DType::Float8E4M3: bytes[i] = floatToE4m3(v); return;
    case DType::Float8E5M2: bytes[i] = floatToE5m2(v); return;
    case DType::Int32: {
      const int32_t n = floatToInt32(v);
      std::memcpy(bytes + i * 4, &n, sizeof n);
      return;
    }
  }
}

float swiglu(float gate, float up) noexcept { return gate / (1.0f + std::exp(-gate)) * up; }

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
    case RedOp::LseMerge: break;  // a row operator: lseMergeRows
  }
  return std::numeric_limits<float>::quiet_NaN();
}

LseWeights lseMergeWeights(float lse1, float lse2) noexcept {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  if (std::isnan(lse1) || std::isnan(lse2)) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    return {nan, nan, nan};
  }
  const float hi = std::max(lse1, lse2), lo = std::min(lse1, lse2);
  if (hi == -kInf) return {-kInf, 0.0f, 0.0f};
  // log1p keeps the digits when the smaller partial is far below the larger one (exp(lo - hi) tiny).
  const float lse = hi + std::log1p(std::exp(lo - hi));
  return {lse, std::exp(lse1 - lse), std::exp(lse2 - lse)};
}

void lseMergeRows(const ElementRange& dst, const ElementRange& a, const ElementRange& b, uint64_t rows,
                  uint32_t width) noexcept {
  const uint64_t stride = uint64_t{width} + 1;
  for (uint64_t row = 0; row < rows; ++row) {
    const uint64_t first = row * stride;
    const LseWeights w = lseMergeWeights(loadElement(a.type, a.base, a.offset + first + width),
                                         loadElement(b.type, b.base, b.offset + first + width));
    for (uint64_t col = first; col < first + width; ++col) {
      const float x = loadElement(a.type, a.base, a.offset + col);
      const float y = loadElement(b.type, b.base, b.offset + col);
      storeElement(dst.type, dst.base, dst.offset + col, x * w.w1 + y * w.w2);
    }
    storeElement(dst.type, dst.base, dst.offset + first + width, w.lse);
  }
}

}  // namespace mk

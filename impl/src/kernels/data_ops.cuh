// mkernel — internal to the resident kernel: the element work of its data steps (conversions, reduction
// operators, the reduce and copy loops over a CTA's piece), bit-exact with models/src/exec/numeric.cpp. Included by
// resident_kernel.cu only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mk/device/engine_device.hpp"
#include "mk/schedule/types.hpp"

namespace mk::device {
namespace {

// ---- element conversions and operators: bit-exact with models/src/exec/numeric.cpp -------------------

template <int kDType>
struct Elem;
template <>
struct Elem<static_cast<int>(DType::Float32)> {
  using Bits = uint32_t;
  static __device__ __forceinline__ float load(Bits v) { return __uint_as_float(v); }
  static __device__ __forceinline__ Bits store(float f) { return __float_as_uint(f); }
};
template <>
struct Elem<static_cast<int>(DType::BFloat16)> {
  using Bits = uint16_t;
  static __device__ __forceinline__ float load(Bits v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }
  static __device__ __forceinline__ Bits store(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<Bits>((u >> 16) | 0x0040u);  // NaN stays NaN
    return static_cast<Bits>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);                    // round to nearest even
  }
};
template <>
struct Elem<static_cast<int>(DType::Float16)> {
  using Bits = uint16_t;
  static __device__ __forceinline__ float load(Bits v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
    return f;
  }
  static __device__ __forceinline__ Bits store(float f) {
    Bits h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));  // round to nearest even, overflow to inf
    return h;
  }
};

template <int kOp>
__device__ __forceinline__ float applyOp(float a, float b) {
  if constexpr (kOp == static_cast<int>(RedOp::Sum)) {
    return __fadd_rn(a, b);  // one rounding; never contracted into an FMA
  } else {
    // NaN propagates; +0 / -0 are ordered so the result does not depend on the order ranks combine in.
    if (isnan(a)) return a;
    if (isnan(b)) return b;
    if (a == b) {
      const bool aNeg = signbit(a);
      if constexpr (kOp == static_cast<int>(RedOp::Max)) return aNeg ? b : a;
      return aNeg ? a : b;
    }
    if constexpr (kOp == static_cast<int>(RedOp::Max)) return a > b ? a : b;
    return a < b ? a : b;
  }
}

template <int kDType, int kOp>
__device__ __forceinline__ uint4 combine(const uint4& p, const uint4& q) {
  using E = Elem<kDType>;
  using Bits = typename E::Bits;
  constexpr int kPerVec = 16 / sizeof(Bits);
  uint4 r;
  const Bits* x = reinterpret_cast<const Bits*>(&p);
  const Bits* y = reinterpret_cast<const Bits*>(&q);
  Bits* z = reinterpret_cast<Bits*>(&r);
#pragma unroll
  for (int k = 0; k < kPerVec; ++k) z[k] = E::store(applyOp<kOp>(E::load(x[k]), E::load(y[k])));
  return r;
}

/// dst[i] = op(a[i], b[i]) for i in [0, n), by threads tid, tid + nth, ... 16-byte vectors when the three
/// pointers share their alignment modulo 16 (scalar head and tail), elementwise otherwise.
template <int kDType, int kOp>
__device__ void reduceRange(char* dst, const char* a, const char* b, uint64_t n, uint32_t tid, uint32_t nth) {
  using E = Elem<kDType>;
  using Bits = typename E::Bits;
  constexpr uint32_t kSize = sizeof(Bits);
  constexpr uint32_t kPerVec = 16 / kSize;
  Bits* z = reinterpret_cast<Bits*>(dst);
  const Bits* x = reinterpret_cast<const Bits*>(a);
  const Bits* y = reinterpret_cast<const Bits*>(b);
  const uintptr_t mis = reinterpret_cast<uintptr_t>(dst) & 15u;
  uint64_t head = n;
  if (mis == (reinterpret_cast<uintptr_t>(a) & 15u) && mis == (reinterpret_cast<uintptr_t>(b) & 15u) &&
      mis % kSize == 0)
    head = min(n, static_cast<uint64_t>(((16u - mis) & 15u) / kSize));
  for (uint64_t i = tid; i < head; i += nth) z[i] = E::store(applyOp<kOp>(E::load(x[i]), E::load(y[i])));
  if (head == n) return;
  const uint64_t nVec = (n - head) / kPerVec;
  const uint4* xv = reinterpret_cast<const uint4*>(x + head);
  const uint4* yv = reinterpret_cast<const uint4*>(y + head);
  uint4* zv = reinterpret_cast<uint4*>(z + head);
  uint64_t i = tid;
  // Two vectors of each operand in flight per thread before the first use.
  for (; i + nth < nVec; i += 2ull * nth) {
    const uint4 p0 = xv[i], q0 = yv[i], p1 = xv[i + nth], q1 = yv[i + nth];
    zv[i] = combine<kDType, kOp>(p0, q0);
    zv[i + nth] = combine<kDType, kOp>(p1, q1);
  }
  for (; i < nVec; i += nth) zv[i] = combine<kDType, kOp>(xv[i], yv[i]);
  for (uint64_t t = head + nVec * kPerVec + tid; t < n; t += nth)
    z[t] = E::store(applyOp<kOp>(E::load(x[t]), E::load(y[t])));
}

template <int kDType>
__device__ void reduceDispatchOp(int op, char* dst, const char* a, const char* b, uint64_t n, uint32_t tid,
                                 uint32_t nth) {
  switch (op) {
    case static_cast<int>(RedOp::Max): return reduceRange<kDType, static_cast<int>(RedOp::Max)>(dst, a, b, n, tid, nth);
    case static_cast<int>(RedOp::Min): return reduceRange<kDType, static_cast<int>(RedOp::Min)>(dst, a, b, n, tid, nth);
    default: return reduceRange<kDType, static_cast<int>(RedOp::Sum)>(dst, a, b, n, tid, nth);
  }
}

__device__ void reduceDispatch(int dtype, int op, char* dst, const char* a, const char* b, uint64_t n, uint32_t tid,
                               uint32_t nth) {
  switch (dtype) {
    case static_cast<int>(DType::BFloat16):
      return reduceDispatchOp<static_cast<int>(DType::BFloat16)>(op, dst, a, b, n, tid, nth);
    case static_cast<int>(DType::Float16):
      return reduceDispatchOp<static_cast<int>(DType::Float16)>(op, dst, a, b, n, tid, nth);
    default: return reduceDispatchOp<static_cast<int>(DType::Float32)>(op, dst, a, b, n, tid, nth);
  }
}

/// Copy `bytes` (a whole number of 2- or 4-byte elements) from src to dst, either of which may be a peer's
/// memory: 16-byte vectors (four in flight per thread) when both share their alignment modulo 16.
__device__ void copyRange(char* dst, const char* src, uint64_t bytes, uint32_t tid, uint32_t nth) {
  const uintptr_t md = reinterpret_cast<uintptr_t>(dst) & 15u;
  const uintptr_t ms = reinterpret_cast<uintptr_t>(src) & 15u;
  if (md == ms && md % 2 == 0) {
    const uint64_t head = min(bytes, static_cast<uint64_t>((16u - md) & 15u));
    for (uint64_t i = tid; i < head / 2; i += nth)
      reinterpret_cast<uint16_t*>(dst)[i] = reinterpret_cast<const uint16_t*>(src)[i];
    const uint64_t nVec = (bytes - head) / 16;
    const uint4* s4 = reinterpret_cast<const uint4*>(src + head);
    uint4* d4 = reinterpret_cast<uint4*>(dst + head);
    uint64_t i = tid;
    for (; i + 3ull * nth < nVec; i += 4ull * nth) {
      const uint4 v0 = s4[i], v1 = s4[i + nth], v2 = s4[i + 2ull * nth], v3 = s4[i + 3ull * nth];
      d4[i] = v0;
      d4[i + nth] = v1;
      d4[i + 2ull * nth] = v2;
      d4[i + 3ull * nth] = v3;
    }
    for (; i < nVec; i += nth) d4[i] = s4[i];
    const uint64_t done = head + nVec * 16;
    for (uint64_t t = tid; t < (bytes - done) / 2; t += nth)
      reinterpret_cast<uint16_t*>(dst + done)[t] = reinterpret_cast<const uint16_t*>(src + done)[t];
  } else if ((md & 3u) == 0 && (ms & 3u) == 0 && bytes % 4 == 0) {
    for (uint64_t i = tid; i < bytes / 4; i += nth)
      reinterpret_cast<uint32_t*>(dst)[i] = reinterpret_cast<const uint32_t*>(src)[i];
  } else {
    for (uint64_t i = tid; i < bytes / 2; i += nth)
      reinterpret_cast<uint16_t*>(dst)[i] = reinterpret_cast<const uint16_t*>(src)[i];
  }
}

}  // namespace
}  // namespace mk::device

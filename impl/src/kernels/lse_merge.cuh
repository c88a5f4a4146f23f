// mkernel — lse-merge of attention rows on the GPU: the resident kernel's Reduce with RedOp::LseMerge
// (worker_lanes.cuh) and the standalone mk::lseMergeDevice (attention.cu) share this one routine.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mk::device {

/// lse-merge of float32 rows [rowBegin, rowEnd) of `width` values and their log-sum-exp (mk/exec/numeric.hpp's
/// lseMergeRows, in float: lse = hi + log1p(exp(lo - hi)), w = exp(lse_x - lse); a row whose two partials saw no key
/// stays 0 with lse -inf, a NaN lse makes the row NaN): one warp per row. dst may alias a or b exactly: every lane
/// reads a row's two log-sum-exps before any lane of the warp writes the row, and each value is read and written by
/// the same lane.
__device__ __forceinline__ void lseMergeRowRange(float* dst, const float* a, const float* b, uint32_t width,
                                                 uint64_t rowBegin, uint64_t rowEnd, uint32_t tid, uint32_t nth) {
  const uint32_t lane = tid % 32, warps = nth / 32;
  const uint64_t stride = uint64_t{width} + 1;
  for (uint64_t row = rowBegin + tid / 32; row < rowEnd; row += warps) {
    const uint64_t first = row * stride;
    const float l1 = a[first + width], l2 = b[first + width];
    __syncwarp();
    float lse, w1, w2;
    if (isnan(l1) || isnan(l2)) {
      lse = w1 = w2 = __int_as_float(0x7fc00000);
    } else {
      const float hi = fmaxf(l1, l2), lo = fminf(l1, l2);
      if (hi == -__int_as_float(0x7f800000)) {
        lse = hi;
        w1 = w2 = 0.0f;
      } else {
        lse = hi + log1pf(expf(lo - hi));
        w1 = expf(l1 - lse);
        w2 = expf(l2 - lse);
      }
    }
    for (uint32_t c = lane; c < width; c += 32) dst[first + c] = a[first + c] * w1 + b[first + c] * w2;
    if (lane == 0) dst[first + width] = lse;
  }
}

}  // namespace mk::device

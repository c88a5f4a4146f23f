// mkernel — the standalone attention forward kernel: a persistent grid whose every CTA runs the device tile engine
// (mk/device/attention_device.hpp) over a strided share of the (batch, query head, query tile) units.
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <set>

#include "attention/attention_launch.hpp"
#include "lse_merge.cuh"
#include "mk/cuda_check.hpp"

namespace mk::runtime {
namespace {

using device::AttentionParams;
using device::AttentionTileConfig;

// 384 threads, one CTA per SM: at most 168 registers per thread before setmaxnreg moves them to the consumers.
template <uint32_t kD>
__global__ void __launch_bounds__(AttentionTileConfig<kD>::kThreads, 1)
    attentionKernel(const __grid_constant__ AttentionParams p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  device::attentionRunUnits<kD>(p, smem, p.unitCounter, blockIdx.x, gridDim.x);
}

/// lse-merge of `rows` rows (the shared device routine, one warp per row).
__global__ void __launch_bounds__(256)
    lseMergeKernel(float* dst, const float* a, const float* b, uint64_t rows, uint32_t width) {
  const uint64_t per = (rows + gridDim.x - 1) / gridDim.x, first = per * blockIdx.x;
  const uint64_t last = first + per < rows ? first + per : rows;
  if (first < last) device::lseMergeRowRange(dst, a, b, width, first, last, threadIdx.x, blockDim.x);
}

template <uint32_t kD>
void launch(const AttentionParams& p, uint32_t ctas, cudaStream_t stream) {
  static std::mutex mu;
  static std::set<int> ready;
  int dev = 0;
  MK_CUDA_CHECK(cudaGetDevice(&dev));
  constexpr int kBytes = static_cast<int>(AttentionTileConfig<kD>::kSmemBytes);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (ready.count(dev) == 0) {
      MK_CUDA_CHECK(cudaFuncSetAttribute(attentionKernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
      ready.insert(dev);
    }
  }
  attentionKernel<kD><<<ctas, AttentionTileConfig<kD>::kThreads, kBytes, stream>>>(p);
}

}  // namespace

void launchAttention(const AttentionParams& p, uint32_t ctas, cudaStream_t stream) {
  if (p.headDim == 64)
    launch<64>(p, ctas, stream);
  else
    launch<128>(p, ctas, stream);
  MK_CUDA_CHECK(cudaGetLastError());
}

void launchLseMerge(float* dst, const float* a, const float* b, uint64_t rows, uint32_t width, cudaStream_t stream) {
  if (rows == 0) return;
  int dev = 0, sms = 0;
  MK_CUDA_CHECK(cudaGetDevice(&dev));
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const uint64_t blocks = std::min<uint64_t>((rows + 7) / 8, 4ull * static_cast<uint64_t>(sms));  // 8 warps a block
  lseMergeKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(dst, a, b, rows, width);
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mk::runtime

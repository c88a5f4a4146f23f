// mkernel — the standalone attention forward kernel: a persistent grid whose every CTA runs the device tile engine
// (mk/device/attention_device.hpp) over a strided share of the (batch, query head, query tile) units.
#include <cuda_runtime.h>

#include <mutex>
#include <set>

#include "attention/attention_launch.hpp"
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
  device::attentionRunUnits<kD>(p, smem, blockIdx.x, gridDim.x);
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

}  // namespace mk::runtime

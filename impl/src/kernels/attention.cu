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
using device::AttentionPipeline;

template <uint32_t kD, AttentionPipeline kPipe>
__global__ void __launch_bounds__(AttentionTileConfig<kD>::kThreads, 1)
    attentionKernel(const __grid_constant__ AttentionParams p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  device::attentionRunUnits<kD, kPipe>(p, smem, blockIdx.x, gridDim.x);
}

template <uint32_t kD, AttentionPipeline kPipe>
void launch(const AttentionParams& p, uint32_t ctas, cudaStream_t stream) {
  static std::mutex mu;
  static std::set<int> ready;
  int dev = 0;
  MK_CUDA_CHECK(cudaGetDevice(&dev));
  constexpr int kBytes = static_cast<int>(AttentionTileConfig<kD>::kSmemBytes);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (ready.count(dev) == 0) {
      MK_CUDA_CHECK(
          cudaFuncSetAttribute(attentionKernel<kD, kPipe>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
      ready.insert(dev);
    }
  }
  attentionKernel<kD, kPipe><<<ctas, AttentionTileConfig<kD>::kThreads, kBytes, stream>>>(p);
}

template <uint32_t kD>
void launchPipeline(const AttentionParams& p, uint32_t ctas, AttentionPipeline pipe, cudaStream_t stream) {
  switch (pipe) {
    case AttentionPipeline::Serial: launch<kD, AttentionPipeline::Serial>(p, ctas, stream); break;
    case AttentionPipeline::Overlap: launch<kD, AttentionPipeline::Overlap>(p, ctas, stream); break;
    case AttentionPipeline::PingPong: launch<kD, AttentionPipeline::PingPong>(p, ctas, stream); break;
  }
}

}  // namespace

void launchAttention(const AttentionParams& p, uint32_t ctas, AttentionPipeline pipe, cudaStream_t stream) {
  if (p.headDim == 64)
    launchPipeline<64>(p, ctas, pipe, stream);
  else
    launchPipeline<128>(p, ctas, pipe, stream);
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mk::runtime

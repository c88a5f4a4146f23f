// mkernel — the standalone GEMM kernel: a persistent grid whose every CTA runs the device tile engine
// (mk/device/gemm_device.hpp) over a strided share of the output tiles, then (stream-K) its range of the
// stream-K region's k-iterations (CTA index = blockIdx.x).
#include <cuda_runtime.h>

#include <mutex>
#include <set>

#include "gemm/gemm_launch.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device/gemm_device.hpp"

namespace mk::runtime {
namespace {

using device::GemmParams;
using device::GemmTileConfigT;

/// Test hook: one counter per output tile, so a test can prove every tile was handed over exactly once.
template <uint32_t kBlockN>
struct CountingHook {
  static constexpr bool kEnabled = true;
  uint32_t* counts;
  uint32_t tilesN;
  __device__ void operator()(uint32_t m0, uint32_t n0) const {
    atomicAdd(&counts[(m0 / GemmTileConfigT<kBlockN>::kBlockM) * tilesN + n0 / kBlockN], 1u);
  }
};

// 384 threads, one CTA per SM: the compiler may use at most 168 registers per thread before setmaxnreg
// moves them from the producer to the consumers.
// kTmaStoreC selects the epilogue (GemmConfig::epilogue): direct register stores or staging + TMA stores.
template <uint32_t kBlockN, bool kTmaStoreC>
__global__ void __launch_bounds__(GemmTileConfigT<kBlockN>::kThreads, 1)
    gemmKernel(const __grid_constant__ GemmParams p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  device::GemmNoHook hook;
  device::gemmRunTiles<kBlockN, kTmaStoreC>(p, smem, blockIdx.x, gridDim.x, device::gemmUnitCount(p), hook, blockIdx.x);
}

template <uint32_t kBlockN, bool kTmaStoreC>
__global__ void __launch_bounds__(GemmTileConfigT<kBlockN>::kThreads, 1)
    gemmKernelCounted(const __grid_constant__ GemmParams p, uint32_t* counts) {
  extern __shared__ __align__(1024) uint8_t smem[];
  CountingHook<kBlockN> hook{counts, p.tilesN};
  device::gemmRunTiles<kBlockN, kTmaStoreC>(p, smem, blockIdx.x, gridDim.x, device::gemmUnitCount(p), hook, blockIdx.x);
}

template <uint32_t kBlockN, bool kTmaStoreC>
void setSmem() {
  const int bytes = static_cast<int>(GemmTileConfigT<kBlockN, kTmaStoreC>::kSmemBytes);
  MK_CUDA_CHECK(
      cudaFuncSetAttribute(gemmKernel<kBlockN, kTmaStoreC>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  MK_CUDA_CHECK(
      cudaFuncSetAttribute(gemmKernelCounted<kBlockN, kTmaStoreC>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <uint32_t kBlockN, bool kTmaStoreC>
void launch(const GemmParams& params, uint32_t ctas, uint32_t* hookCounts, cudaStream_t stream) {
  using Cfg = GemmTileConfigT<kBlockN, kTmaStoreC>;
  const dim3 grid(ctas), block(Cfg::kThreads);
  if (hookCounts)
    gemmKernelCounted<kBlockN, kTmaStoreC><<<grid, block, Cfg::kSmemBytes, stream>>>(params, hookCounts);
  else
    gemmKernel<kBlockN, kTmaStoreC><<<grid, block, Cfg::kSmemBytes, stream>>>(params);
}

}  // namespace

void prepareGemmKernels() {
  static std::mutex mu;
  static std::set<int> done;
  int dev = 0;
  MK_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (done.count(dev)) return;
  setSmem<128, false>();
  setSmem<256, false>();
  setSmem<128, true>();
  setSmem<256, true>();
  done.insert(dev);
}

void launchGemm(const GemmParams& params, uint32_t ctas, uint32_t* hookCounts, cudaStream_t stream) {
  const bool tma = params.tmaStoreC != 0;
  if (params.blockN == 128)
    tma ? launch<128, true>(params, ctas, hookCounts, stream) : launch<128, false>(params, ctas, hookCounts, stream);
  else
    tma ? launch<256, true>(params, ctas, hookCounts, stream) : launch<256, false>(params, ctas, hookCounts, stream);
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mk::runtime

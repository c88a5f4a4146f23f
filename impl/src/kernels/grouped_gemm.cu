// mkernel — the standalone grouped GEMM kernels: a persistent grid whose every CTA runs the grouped tile engine
// (mk/device/grouped_gemm_device.hpp) over a strided share of the tile list of all groups; one kernel per epilogue.
#include <cuda_runtime.h>

#include <mutex>
#include <set>

#include "grouped_gemm/grouped_gemm_launch.hpp"
#include "mk/cuda_check.hpp"

namespace mk::runtime {
namespace {

using device::GroupedGemmParams;
using device::GroupedGemmTileConfig;

// 384 threads, one CTA per SM: at most 168 registers per thread before setmaxnreg moves them to the consumers.
// kTmaStoreC: the TMA-store epilogue (GroupedGemmParams::gemm.tmaStoreC), else direct stores.
template <bool kTmaStoreC>
__global__ void __launch_bounds__(GroupedGemmTileConfig::kThreads, 1)
    groupedGemmKernel(const __grid_constant__ GroupedGemmParams p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  device::groupedGemmRunTiles<kTmaStoreC>(p, smem, blockIdx.x, gridDim.x);
}

template <bool kTmaStoreC>
void launch(const GroupedGemmParams& p, uint32_t ctas, cudaStream_t stream) {
  static std::mutex mu;
  static std::set<int> ready;
  int dev = 0;
  MK_CUDA_CHECK(cudaGetDevice(&dev));
  constexpr int kBytes = static_cast<int>(device::kGroupedGemmSmemBytes<kTmaStoreC>);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (ready.count(dev) == 0) {
      MK_CUDA_CHECK(
          cudaFuncSetAttribute(groupedGemmKernel<kTmaStoreC>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
      ready.insert(dev);
    }
  }
  groupedGemmKernel<kTmaStoreC><<<ctas, GroupedGemmTileConfig::kThreads, kBytes, stream>>>(p);
}

}  // namespace

void launchGroupedGemm(const GroupedGemmParams& p, uint32_t ctas, cudaStream_t stream) {
  if (p.gemm.tmaStoreC != 0)
    launch<true>(p, ctas, stream);
  else
    launch<false>(p, ctas, stream);
  MK_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mk::runtime

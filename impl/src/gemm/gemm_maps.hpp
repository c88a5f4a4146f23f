// mkernel — internal: TMA descriptors of the GEMM engine, shared by the standalone plan (gemm.cpp) and the
// resident kernel's compute lanes (gemm_lane.cpp).
#pragma once

#include <cstdint>

#include "mk/device/gemm_device.hpp"

namespace mk::runtime {

/// Encode a 2-D bf16 tensor map: `inner` x `outer` elements, rows `strideElems` apart, box `boxInner` x
/// `boxOuter`, 128-byte swizzle (the wgmma descriptors' layout), out-of-bounds elements read as zero (loads)
/// or skipped (stores). Throws Error(CudaError) naming `name` when the driver refuses it.
device::GemmTensorMap encodeGemmMap2d(const void* base, uint64_t inner, uint64_t outer, uint64_t strideElems,
                                      uint32_t boxInner, uint32_t boxOuter, const char* name);

}  // namespace mk::runtime

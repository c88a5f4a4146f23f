// mkernel — host-side data and reference for the fused operators on the GPU (mk-bench gemm-rs|ag-gemm|gemm-ar --check
// and the fused GPU tests): the whole A and B drawn from one seed, every rank's pieces in the layout of
// mk/algorithms/fused.hpp, and an element-wise comparison of a rank's C with the exact product under the tolerance
// of mk::verifyFused (docs/fused-operators.md, "Verification"). Pure C++ (no CUDA).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/algorithms/fused.hpp"

namespace mkbench {

/// bfloat16 bit patterns (round to nearest even) and back.
uint16_t toBf16(float f);
float fromBf16(uint16_t h);

/// The inputs of one fused op: whole A (m x k) and B (k x n), row-major bf16, and each rank's a and b.
struct FusedHostData {
  mk::FusedSpec spec;
  uint32_t ranks = 0;
  std::vector<uint16_t> A, B;
  std::vector<std::vector<uint16_t>> a, b;  ///< per rank, as the rank binds them
  std::vector<mk::FusedShard> shards;
};

/// Uniform [-1, 1) bf16 values from `seed` (the same A and B for any rank count).
FusedHostData makeFusedInputs(const mk::FusedSpec& spec, uint32_t ranks, uint64_t seed);

/// Elements of rank r's c.
uint64_t fusedOutputCount(const FusedHostData& d, uint32_t rank);

/// Outcome of a comparison.
struct FusedCheck {
  uint64_t checked = 0, wrong = 0;
  double worstRatio = 0;  ///< largest |got - ref| / tolerance (<= 1 passes)
  std::string first;      ///< the first mismatch, or "OK"
  bool ok() const { return wrong == 0 && checked > 0; }
};

/// Compare rank r's `c` (bf16 bits, fusedOutputCount elements) with the reference, element by element: every
/// element when `samples` is 0, else `samples` elements drawn from `seed` (large shapes: an exact dot product
/// costs k multiply-adds on the host).
FusedCheck checkFusedOutput(const FusedHostData& d, uint32_t rank, const uint16_t* c, uint64_t samples = 0,
                            uint64_t seed = 1);

}  // namespace mkbench

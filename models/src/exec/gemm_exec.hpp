// mkernel — internal: the CPU executor's gemm step arithmetic (Gemm and GroupedGemm groups), on bound host memory.
#pragma once

#include <cstdint>
#include <vector>

#include "mk/exec/numeric.hpp"

namespace mk::detail {

/// Sizes and layout of one gemm tile, checked by the caller: A row-major m x k (lda), B k x n row-major or, with
/// bColMajor, n x k (ldb), C m x n (or m x n / 2 with swiglu) row-major (ldc); k >= 1.
struct GemmTileArgs {
  uint64_t m = 0, n = 0, k = 0;
  uint64_t lda = 0, ldb = 0, ldc = 0;
  bool bColMajor = false;
  bool swiglu = false;      ///< C[i][f] = silu(gate) x up of the interleaved column pair (2f, 2f + 1)
  bool accumulate = false;  ///< C += A x B (never with swiglu)
};

/// C <- A x B (or C += A x B, or the SwiGLU of it), each dot product in float, rounded once to C's type. A and B are
/// first read into dense float rows (`scratchA`, `scratchB`, reused across calls) so both inner loops are contiguous
/// whatever B's stored layout.
void runGemm(const GemmTileArgs& t, const ElementRange& c, const ElementRange& a, const ElementRange& b,
             std::vector<float>& scratchA, std::vector<float>& scratchB);

}  // namespace mk::detail

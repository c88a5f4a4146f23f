// mkernel — the CPU executor's gemm step arithmetic (gemm_exec.hpp).
#include "gemm_exec.hpp"

namespace mk::detail {

void runGemm(const GemmTileArgs& t, const ElementRange& c, const ElementRange& a, const ElementRange& b,
             std::vector<float>& scratchA, std::vector<float>& scratchB) {
  const uint64_t m = t.m, n = t.n, k = t.k;
  // A as dense row-major float [m][k], B as dense column-major float [n][k].
  std::vector<float>& fa = scratchA;
  std::vector<float>& fb = scratchB;
  fa.resize(static_cast<std::size_t>(m * k));
  fb.resize(static_cast<std::size_t>(n * k));
  for (uint64_t i = 0; i < m; ++i)
    for (uint64_t kk = 0; kk < k; ++kk) fa[i * k + kk] = loadElement(a.type, a.base, a.offset + i * t.lda + kk);
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t kk = 0; kk < k; ++kk) {
      const uint64_t at = t.bColMajor ? j * t.ldb + kk : kk * t.ldb + j;
      fb[j * k + kk] = loadElement(b.type, b.base, b.offset + at);
    }
  auto dot = [&](uint64_t i, uint64_t j) {
    const float* ar = fa.data() + i * k;
    const float* bc = fb.data() + j * k;
    float acc = 0.0f;
    for (uint64_t kk = 0; kk < k; ++kk) acc += ar[kk] * bc[kk];
    return acc;
  };
  if (t.swiglu) {  // C[i][f] = silu(gate) x up of the interleaved pair (2f, 2f + 1), rounded once
    for (uint64_t i = 0; i < m; ++i)
      for (uint64_t f = 0; f < n / 2; ++f) {
        const float gate = dot(i, 2 * f), up = dot(i, 2 * f + 1);
        storeElement(c.type, c.base, c.offset + i * t.ldc + f, swiglu(gate, up));
      }
    return;
  }
  for (uint64_t i = 0; i < m; ++i)
    for (uint64_t j = 0; j < n; ++j) {
      float acc = dot(i, j);
      const uint64_t ci = c.offset + i * t.ldc + j;
      if (t.accumulate) acc += loadElement(c.type, c.base, ci);
      storeElement(c.type, c.base, ci, acc);
    }
}

}  // namespace mk::detail

// mkernel — host data and reference for the fused operators on the GPU (fused_check.hpp).
#include "fused_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

namespace mkbench {

uint16_t toBf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even (finite inputs)
  return static_cast<uint16_t>(u >> 16);
}

float fromBf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace {

/// splitmix64 uniform [-1, 1) as bf16: fast enough for the 134 M-element operands of b = 16384.
void fill(std::vector<uint16_t>& v, uint64_t seed) {
  uint64_t x = seed;
  for (uint16_t& h : v) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    h = toBf16(2.0f * u - 1.0f);
  }
}

}  // namespace

FusedHostData makeFusedInputs(const mk::FusedSpec& spec, uint32_t ranks, uint64_t seed) {
  FusedHostData d;
  d.spec = spec;
  d.ranks = ranks;
  d.shards = mk::fusedShards(spec, ranks);
  d.A.resize(spec.m * spec.k);
  d.B.resize(spec.k * spec.n);
  fill(d.A, seed * 2 + 1);
  fill(d.B, seed * 2 + 2);
  const bool ag = spec.op == mk::FusedOp::AllGatherGemm;
  const bool colB = spec.layoutB == mk::MatrixLayout::ColMajor;
  for (uint32_t r = 0; r < ranks; ++r) {
    const mk::FusedShard& sh = d.shards[r];
    const uint64_t aRows = ag ? sh.rows : spec.m, aRow0 = ag ? sh.rowBegin : 0;
    std::vector<uint16_t> a(aRows * sh.kLen), b(sh.kLen * sh.cols);
    for (uint64_t i = 0; i < aRows; ++i)
      std::memcpy(&a[i * sh.kLen], &d.A[(aRow0 + i) * spec.k + sh.kBegin], sh.kLen * 2);
    for (uint64_t kk = 0; kk < sh.kLen; ++kk)
      for (uint64_t j = 0; j < sh.cols; ++j)
        b[colB ? j * sh.kLen + kk : kk * sh.cols + j] = d.B[(sh.kBegin + kk) * spec.n + sh.colBegin + j];
    d.a.push_back(std::move(a));
    d.b.push_back(std::move(b));
  }
  return d;
}

uint64_t fusedOutputCount(const FusedHostData& d, uint32_t rank) {
  const mk::FusedShard& sh = d.shards[rank];
  switch (d.spec.op) {
    case mk::FusedOp::GemmReduceScatter: return sh.rows * d.spec.n;
    case mk::FusedOp::GemmAllReduce: return d.spec.m * d.spec.n;
    case mk::FusedOp::AllGatherGemm: return d.spec.m * sh.cols;
  }
  return 0;
}

FusedCheck checkFusedOutput(const FusedHostData& d, uint32_t rank, const uint16_t* c, uint64_t samples, uint64_t seed) {
  const mk::FusedSpec& sp = d.spec;
  const mk::FusedShard& sh = d.shards[rank];
  const bool ag = sp.op == mk::FusedOp::AllGatherGemm, ar = sp.op == mk::FusedOp::GemmAllReduce;
  const uint64_t rows = ag || ar ? sp.m : sh.rows, row0 = ag || ar ? 0 : sh.rowBegin;
  const uint64_t cols = sh.cols;
  // The tolerance of mk::verifyFused for bfloat16 (verify_fused.hpp).
  const double u = std::ldexp(1.0, -8), uEff = u + std::ldexp(1.0, -24);
  uint64_t longestK = 0;
  for (const mk::FusedShard& s : d.shards) longestK = std::max(longestK, s.kLen);
  const double reductions = ag ? 0.0 : static_cast<double>(d.ranks - 1);
  const double accumulate = static_cast<double>(longestK - 1) * std::ldexp(1.0, -24);
  const double halfSubnormal = std::ldexp(1.0, -134);
  FusedCheck res;
  res.first = "OK";
  auto one = [&](uint64_t i, uint64_t j) {
    const uint64_t gi = row0 + i, gj = sh.colBegin + j;
    double sum = 0, abs = 0;
    for (uint64_t kk = 0; kk < sp.k; ++kk) {
      const double p = static_cast<double>(fromBf16(d.A[gi * sp.k + kk])) * fromBf16(d.B[kk * sp.n + gj]);
      sum += p;
      abs += std::fabs(p);
    }
    const double want = fromBf16(toBf16(static_cast<float>(sum)));
    const double tol =
        ((accumulate + u + reductions * uEff) * abs + u * std::fabs(want)) * (1 + 2 * (reductions + 2) * uEff) +
        (reductions + 2) * halfSubnormal;
    const double got = fromBf16(c[i * cols + j]);
    const double err = std::fabs(got - want);
    ++res.checked;
    const double ratio = tol > 0 ? err / tol : (err > 0 ? INFINITY : 0);
    if (!(ratio <= 1)) {  // NaN fails too
      if (res.wrong == 0) {
        std::ostringstream os;
        os << "rank " << rank << " c[" << i << "][" << j << "] (C[" << gi << "][" << gj << "]): got " << got
           << " expected " << want << " (tol " << tol << ")";
        res.first = os.str();
      }
      ++res.wrong;
    }
    if (std::isfinite(ratio))
      res.worstRatio = std::max(res.worstRatio, ratio);
    else
      res.worstRatio = INFINITY;
  };
  if (samples == 0) {
    for (uint64_t i = 0; i < rows; ++i)
      for (uint64_t j = 0; j < cols; ++j) one(i, j);
  } else {
    std::mt19937_64 rng(seed);
    for (uint64_t s = 0; s < samples; ++s) one(rng() % rows, rng() % cols);
  }
  return res;
}

}  // namespace mkbench

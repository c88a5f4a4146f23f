// mkernel — a fused operator on the CPU executor against a plain reference (verify_fused.hpp has the tolerance).
#include "mk/exec/verify_fused.hpp"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/exec/numeric.hpp"
#include "verify_common.hpp"

namespace mk {

namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::InvalidArgument, "verifyFused: " + what); }

/// The buffer called `name`, of the spec's dtype, with `want[r]` elements on every rank r.
uint16_t requireBuffer(const Schedule& s, const FusedSpec& spec, const char* name, const std::vector<uint64_t>& want) {
  const int b = s.bufferIndex(name);
  if (b < 0)
    bad(std::string("the schedule has no buffer named '") + name + "' (is it a " + toString(spec.op) + " schedule?)");
  const BufferDecl& d = s.buffers[static_cast<std::size_t>(b)];
  if (d.dtype != spec.dtype)
    bad(std::string("buffer '") + name + "' is " + toString(d.dtype) + ", the spec says " + toString(spec.dtype));
  for (uint32_t r = 0; r < s.nRanks; ++r)
    if (d.count.size() != s.nRanks || d.count[r] != want[r])
      bad(std::string("buffer '") + name + "' of rank " + std::to_string(r) + " has " +
          (d.count.size() == s.nRanks ? std::to_string(d.count[r]) : std::string("no")) + " elements, expected " +
          std::to_string(want[r]) + " for " + toString(spec.op) + " " + std::to_string(spec.m) + " x " +
          std::to_string(spec.n) + " x " + std::to_string(spec.k));
  return static_cast<uint16_t>(b);
}

/// Largest magnitude R of integer inputs for which k products of at most R^2 and all their partial sums are exact in
/// a dtype with `bits` significant bits (at least 1).
uint32_t integerRange(uint64_t k, int bits) {
  const double r = std::floor(std::sqrt(std::ldexp(1.0, bits) / static_cast<double>(k)));
  return r < 1 ? 1 : static_cast<uint32_t>(r);
}

}  // namespace

VerifyResult verifyFused(const Schedule& s, const FusedSpec& spec, uint64_t seed, InputKind kind,
                         const ExecOptions& opt) {
  const uint32_t p = s.nRanks;
  const std::vector<FusedShard> shards = fusedShards(spec, p);
  const bool agGemm = spec.op == FusedOp::AllGatherGemm;
  const bool allReduce = spec.op == FusedOp::GemmAllReduce;
  const uint64_t m = spec.m, n = spec.n, k = spec.k;
  std::vector<uint64_t> aCount(p), bCount(p), cCount(p);
  for (uint32_t r = 0; r < p; ++r) {
    const FusedShard& sh = shards[r];
    aCount[r] = (agGemm ? sh.rows : m) * sh.kLen;
    bCount[r] = sh.kLen * sh.cols;
    cCount[r] = (agGemm || allReduce ? m : sh.rows) * sh.cols;
  }
  const uint16_t aBuf = requireBuffer(s, spec, "a", aCount);
  const uint16_t bBuf = requireBuffer(s, spec, "b", bCount);
  const uint16_t cBuf = requireBuffer(s, spec, "c", cCount);

  // The whole A and B, drawn in one order from one stream: the same matrices on any rank count.
  const int bits = spec.dtype == DType::BFloat16 ? 8 : 11;
  const uint32_t range = integerRange(k, bits);
  const bool exact = kind == InputKind::SmallIntegers && k * range * range <= (uint64_t{1} << bits);
  std::mt19937_64 rng(seed);
  auto draw = [&] { return detail::roundTo(spec.dtype, detail::inputValue(kind, rng(), range)); };
  std::vector<float> A(m * k), B(k * n);  // both row-major
  for (float& v : A) v = draw();
  for (float& v : B) v = draw();

  // A run that spans processes (opt.localRanks) holds and checks its own ranks; every process draws the whole A and
  // B (the reference needs them) from the same seed.
  const std::vector<char> local = detail::localRankMask(opt, p);
  HostMemory mem = detail::allocateLocal(s, opt);
  const bool colB = spec.layoutB == MatrixLayout::ColMajor;
  for (uint32_t r = 0; r < p; ++r) {
    if (!local[r]) continue;
    const FusedShard& sh = shards[r];
    std::byte* a = mem.bytes[r][aBuf].data();
    std::byte* b = mem.bytes[r][bBuf].data();
    // gemm-rs / gemm-ar: all rows, columns kBegin.. of A; ag-gemm: rows rowBegin.., all columns.
    const uint64_t aRows = agGemm ? sh.rows : m, aRow0 = agGemm ? sh.rowBegin : 0;
    for (uint64_t i = 0; i < aRows; ++i)
      for (uint64_t kk = 0; kk < sh.kLen; ++kk)
        storeElement(spec.dtype, a, i * sh.kLen + kk, A[(aRow0 + i) * k + sh.kBegin + kk]);
    for (uint64_t kk = 0; kk < sh.kLen; ++kk)
      for (uint64_t j = 0; j < sh.cols; ++j)
        storeElement(spec.dtype, b, colB ? j * sh.kLen + kk : kk * sh.cols + j,
                     B[(sh.kBegin + kk) * n + sh.colBegin + j]);
  }

  execute(s, mem, opt);

  // Reference: each element's exact dot product (products of 16-bit values are exact in double, and so is the sum
  // to far below the tolerance), rounded once; and sum |a b| for the tolerance.
  const double u = detail::unitRoundoff(spec.dtype);
  const double uEff = u + 0x1p-24;
  uint64_t longestK = 0;
  for (const FusedShard& sh : shards) longestK = std::max(longestK, sh.kLen);
  const double reductions = agGemm ? 0.0 : static_cast<double>(p - 1);
  const double accumulate = static_cast<double>(longestK - 1) * 0x1p-24;
  std::vector<double> ref(m * n), absSum(m * n);
  for (uint64_t i = 0; i < m; ++i)
    for (uint64_t j = 0; j < n; ++j) {
      double sum = 0, abs = 0;
      for (uint64_t kk = 0; kk < k; ++kk) {
        const double prod = static_cast<double>(A[i * k + kk]) * static_cast<double>(B[kk * n + j]);
        sum += prod;
        abs += std::fabs(prod);
      }
      ref[i * n + j] = detail::roundOnce(spec.dtype, sum);
      absSum[i * n + j] = abs;
    }

  VerifyResult res;
  res.ok = true;
  res.detail = "OK";
  for (uint32_t r = 0; r < p; ++r) {
    if (!local[r]) continue;
    const FusedShard& sh = shards[r];
    const std::byte* c = mem.bytes[r][cBuf].data();
    const uint64_t rows = agGemm || allReduce ? m : sh.rows, row0 = agGemm || allReduce ? 0 : sh.rowBegin;
    for (uint64_t i = 0; i < rows; ++i)
      for (uint64_t j = 0; j < sh.cols; ++j) {
        const uint64_t at = (row0 + i) * n + sh.colBegin + j;
        const double want = ref[at];
        double tol = 0;
        if (!exact)
          tol = ((accumulate + u + reductions * uEff) * absSum[at] + u * std::fabs(want)) *
                    (1 + 2 * (reductions + 2) * uEff) +
                (reductions + 2) * detail::subnormalHalfStep(spec.dtype);
        detail::checkElement(res, loadElement(spec.dtype, c, i * sh.cols + j), want, tol, [&] {
          return "rank " + std::to_string(r) + " c[" + std::to_string(i) + "][" + std::to_string(j) + "] (C[" +
                 std::to_string(row0 + i) + "][" + std::to_string(sh.colBegin + j) + "])";
        });
      }
  }
  if (allReduce)
    detail::checkIdenticalAcrossRanks(res, mem, cBuf, m * n, spec.dtype, "c",
                                      "gemm-ar outputs must be bit-identical on every rank");
  return res;
}

}  // namespace mk

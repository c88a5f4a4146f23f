// mk-bench grouped-gemm: the grouped GEMM engine (mk/grouped_gemm.hpp) timed on a MoE layer's expert FFN.
//
//   mk-bench grouped-gemm [--tokens 8192,...] [--routing balanced,skewed] [--epilogue tma-store|direct] [--json f]
//
// Shapes (mKernel's, issue 39): hidden H 7168, intermediate F 2048, 256 experts over 8 ranks (32 local experts per
// GPU), top-8, T tokens over the ranks: each GPU receives T x 8 / 8 = T rows for its local experts, T / 32 per
// expert when balanced. Both GEMMs of the FFN: "up" (K = H, N = 2F, gate / up columns interleaved, SwiGLU epilogue
// into F bf16 columns) and "down" (K = F, N = H, bf16). Routing "skewed": expert e of the E local ones gets a share
// proportional to 1 / (e + 1) (Zipf, s = 1): the first expert ~25 % of the rows, the last ~0.8 %; the counts sum to
// T either way. Rows packed (in-kernel prefix sums, as torch._grouped_mm's offsets), weights stored per expert as
// N x K (nn.Linear's layout; --layout-b row for K x N). Timing: `warmup` runs, then `reps` loops of `iters` runs
// between two CUDA events; reported time = median over the loops of (loop time / iters). FLOPs = 2 x T x N x K.
// A spot check compares 64 sampled outputs with a double-precision host dot product (exit 1 if one is off). The
// layered baseline in the same run (--baseline cublaslt, the default): one cuBLASLt matmul per expert with rows (the
// GEMM alone: for "up" into 2F columns, no SwiGLU), records impl "cublaslt", algo "per-expert-loop". The
// PyTorch baseline (torch._grouped_mm or a loop of torch.mm) is validation/tools/grouped_gemm_bench.py, same shapes
// and timing, run in the same device session.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "cublaslt_loader.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/grouped_gemm.hpp"
#include "mk/io/measurement.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/format.hpp"

namespace mkbench {
namespace {

struct Args {
  std::vector<uint64_t> tokens{8192, 16384, 32768, 65536, 131072};
  std::vector<std::string> routing{"balanced", "skewed"};
  uint64_t localExperts = 32, hidden = 7168, intermediate = 2048;
  uint64_t iters = 10, reps = 5, warmup = 2;
  std::string json, layoutB = "col", epilogue = "tma-store", baseline = "cublaslt";
};

/// Rows per local expert summing to `tokens`: equal shares (the remainder spread over the first experts) or Zipf.
std::vector<int32_t> routeCounts(uint64_t tokens, uint64_t experts, const std::string& routing) {
  std::vector<double> w(experts, 1.0);
  if (routing == "skewed")
    for (uint64_t e = 0; e < experts; ++e) w[e] = 1.0 / static_cast<double>(e + 1);
  double sum = 0;
  for (double x : w) sum += x;
  std::vector<int32_t> counts(experts);
  uint64_t given = 0;
  for (uint64_t e = 0; e < experts; ++e) {
    counts[e] = static_cast<int32_t>(std::floor(static_cast<double>(tokens) * w[e] / sum));
    given += static_cast<uint64_t>(counts[e]);
  }
  for (uint64_t e = 0; given < tokens; e = (e + 1) % experts, ++given) ++counts[e];
  return counts;
}

struct Gemm {
  const char* name;
  uint64_t n, k;
  bool swiglu;
};

/// Host bf16 values of `count` elements at device address `src`.
std::vector<uint16_t> fetch(const void* src, uint64_t count) {
  std::vector<uint16_t> v(count);
  MK_CUDA_CHECK(cudaMemcpy(v.data(), src, count * 2, cudaMemcpyDeviceToHost));
  return v;
}

/// Spot check: `samples` random outputs against a double dot product of the same bf16 inputs; tolerance as
/// mk_grouped_gemm_gpu_tests (fp32 accumulation k x 2^-23 x sum |ab|, one bf16 rounding 2^-8, SwiGLU propagation).
uint64_t spotCheck(const Gemm& gm, const std::vector<int32_t>& counts, const uint16_t* a, const uint16_t* w,
                   bool bColMajor, const uint16_t* c, uint64_t samples, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> start(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) start[e + 1] = start[e] + static_cast<uint64_t>(counts[e]);
  const uint64_t outCols = gm.swiglu ? gm.n / 2 : gm.n;
  uint64_t bad = 0;
  for (uint64_t i = 0; i < samples; ++i) {
    const uint64_t row = rng() % start.back();
    const size_t e = static_cast<size_t>(std::upper_bound(start.begin(), start.end(), row) - start.begin() - 1);
    const uint64_t col = rng() % outCols;
    const std::vector<uint16_t> aRow = fetch(a + row * gm.k, gm.k);
    const uint16_t* we = w + e * gm.n * gm.k;
    auto dot = [&](uint64_t n, double& mag) {
      std::vector<uint16_t> bCol;
      if (bColMajor) {
        bCol = fetch(we + n * gm.k, gm.k);
      } else {
        bCol.resize(gm.k);  // one element per row of K x N: a strided copy
        MK_CUDA_CHECK(cudaMemcpy2D(bCol.data(), 2, we + n, gm.n * 2, 2, gm.k, cudaMemcpyDeviceToHost));
      }
      double s = 0;
      mag = 0;
      for (uint64_t kk = 0; kk < gm.k; ++kk) {
        const double prod = static_cast<double>(mk::bf16ToFloat(aRow[kk])) * mk::bf16ToFloat(bCol[kk]);
        s += prod;
        mag += std::fabs(prod);
      }
      return s;
    };
    const double accRel = static_cast<double>(gm.k) * std::ldexp(1.0, -23);
    double want = 0, tol = 0, m0 = 0, m1 = 0;
    if (gm.swiglu) {
      const double gate = dot(2 * col, m0), up = dot(2 * col + 1, m1);
      const double silu = gate / (1.0 + std::exp(-gate));
      want = silu * up;
      tol = 1.1 * std::fabs(up) * accRel * m0 + std::fabs(silu) * accRel * m1 + accRel * m0 * accRel * m1 +
            std::ldexp(std::fabs(want), -8) + std::ldexp(std::fabs(want), -21);
    } else {
      want = dot(col, m0);
      tol = accRel * m0 + std::ldexp(std::fabs(want), -8);
    }
    const double have = mk::bf16ToFloat(fetch(c + row * outCols + col, 1)[0]);
    if (!(std::fabs(have - want) <= tol)) {
      if (bad < 4)
        std::fprintf(stderr, "# %s: expert %zu row %llu col %llu: got %g, want %g (tol %g)\n", gm.name, e,
                     static_cast<unsigned long long>(row), static_cast<unsigned long long>(col), have, want, tol);
      ++bad;
    }
  }
  return bad;
}

/// Median over `reps` loops of (loop time / iters) of `iters` calls of `run` on `stream`, after `warmup` calls: us.
double timeLoop(const std::function<void()>& run, const Args& a, cudaStream_t stream, cudaEvent_t ev0,
                cudaEvent_t ev1) {
  for (uint64_t i = 0; i < a.warmup; ++i) run();
  std::vector<double> samples;
  for (uint64_t r = 0; r < a.reps; ++r) {
    MK_CUDA_CHECK(cudaEventRecord(ev0, stream));
    for (uint64_t i = 0; i < a.iters; ++i) run();
    MK_CUDA_CHECK(cudaEventRecord(ev1, stream));
    MK_CUDA_CHECK(cudaEventSynchronize(ev1));
    float ms = 0;
    MK_CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
    samples.push_back(1000.0 * ms / static_cast<double>(a.iters));
  }
  return median(samples);
}

}  // namespace

int groupedGemmMain(int argc, char** argv, const std::string& command) {
  Args a;
  CLI::App app{"mk-bench grouped-gemm: the grouped GEMM engine on a MoE expert FFN (H 7168, F 2048, top-8)"};
  app.add_option("--tokens", a.tokens, "tokens over the ranks (= rows this GPU receives)")
      ->delimiter(',')
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 24));
  app.add_option("--routing", a.routing, "balanced and / or skewed (Zipf over the local experts)")
      ->delimiter(',')
      ->check(CLI::IsMember({"balanced", "skewed"}));
  app.add_option("--local-experts", a.localExperts, "experts on this GPU")->check(CLI::Range(1, 1024));
  app.add_option("--hidden", a.hidden, "H: K of the up GEMM, N of the down GEMM")->check(CLI::Range(8, 65536));
  app.add_option("--intermediate", a.intermediate, "F: the up GEMM writes F SwiGLU columns from 2F")
      ->check(CLI::Range(8, 65536));
  app.add_option("--layout-b", a.layoutB, "weights per expert: col (N x K, nn.Linear) or row (K x N)")
      ->check(CLI::IsMember({"col", "row"}));
  app.add_option("--epilogue", a.epilogue, "tma-store (the default; the plain GEMM only) or direct, for A/B runs")
      ->check(CLI::IsMember({"tma-store", "direct"}));
  app.add_option("--baseline", a.baseline, "cublaslt (a loop of cuBLASLt matmuls, one per expert) or none")
      ->check(CLI::IsMember({"cublaslt", "none"}));
  app.add_option("--json", a.json, "write measurement records (mkernel.measurement.v1) to this file, atomically");
  app.add_option("--iters", a.iters, "runs per timed loop")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup", a.warmup, "untimed runs before timing");
  app.add_option("--reps", a.reps, "timed loops; the median is reported")->check(CLI::PositiveNumber);
  if (int rc = mk::cli::parse(app, argc, argv, "mk-bench grouped-gemm"); rc != mk::cli::kContinue) return rc;
  if (a.hidden % 8 != 0 || a.intermediate % 8 != 0) {
    std::fprintf(stderr, "mk-bench grouped-gemm: --hidden and --intermediate must be multiples of 8\n");
    return 2;
  }
  try {
    MK_CUDA_CHECK(cudaSetDevice(0));
    int sms = 0;
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t stream = nullptr;
    cudaEvent_t ev0 = nullptr, ev1 = nullptr;
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    MK_CUDA_CHECK(cudaEventCreate(&ev0));
    MK_CUDA_CHECK(cudaEventCreate(&ev1));
    const bool colMajor = a.layoutB == "col";
    const uint64_t experts = a.localExperts, h = a.hidden, f = a.intermediate;
    std::printf(
        "# mk-bench grouped-gemm: GPU 0 (%d SMs), bf16, H %llu, F %llu, %llu local experts, B %s, iters %llu, "
        "reps %llu\n",
        sms, static_cast<unsigned long long>(h), static_cast<unsigned long long>(f),
        static_cast<unsigned long long>(experts), a.layoutB.c_str(), static_cast<unsigned long long>(a.iters),
        static_cast<unsigned long long>(a.reps));
    std::printf("%8s %9s %5s %9s %9s %10s %12s %10s %12s %9s %8s\n", "tokens", "routing", "gemm", "min_rows",
                "max_rows", "epilogue", "ours_us", "TFLOPs", "cublaslt_us", "vs_cublas", "badspot");
    std::unique_ptr<CublasLt> lt;
    if (a.baseline == "cublaslt") {
      try {
        lt = std::make_unique<CublasLt>();
        std::printf("# baseline: cuBLASLt %s (%s), one matmul per expert\n", lt->version().c_str(), lt->path().c_str());
      } catch (const mk::Error& e) {
        std::printf("# baseline: none (%s)\n", e.what());
      }
    }
    mk::MeasurementFile file = newMeasurementFile(1, "", command);
    uint64_t seed = std::random_device{}();
    const Gemm gemms[2] = {{"up", 2 * f, h, true}, {"down", h, f, false}};
    uint64_t badTotal = 0;
    for (const Gemm& gm : gemms) {
      const uint64_t maxTokens = *std::max_element(a.tokens.begin(), a.tokens.end());
      const uint64_t outCols = gm.swiglu ? gm.n / 2 : gm.n;
      uint16_t *dA = nullptr, *dW = nullptr, *dC = nullptr;
      int32_t* dCounts = nullptr;
      MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dA), maxTokens * gm.k * 2));
      MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dW), experts * gm.n * gm.k * 2));
      MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dC), maxTokens * outCols * 2));
      MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dCounts), experts * 4));
      uint16_t* dBase = nullptr;  // the baseline's output (all n columns)
      if (lt) MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dBase), maxTokens * gm.n * 2));
      fillRandomBf16(dA, maxTokens * gm.k, ++seed);
      fillRandomBf16(dW, experts * gm.n * gm.k, ++seed);
      std::vector<const void*> bPtrs;
      for (uint64_t e = 0; e < experts; ++e) bPtrs.push_back(dW + e * gm.n * gm.k);
      for (uint64_t tokens : a.tokens)
        for (const std::string& routing : a.routing) {
          const std::vector<int32_t> counts = routeCounts(tokens, experts, routing);
          MK_CUDA_CHECK(cudaMemcpy(dCounts, counts.data(), experts * 4, cudaMemcpyHostToDevice));
          mk::GroupedGemmProblem pr;
          pr.groups = static_cast<int64_t>(experts);
          pr.n = static_cast<int64_t>(gm.n);
          pr.k = static_cast<int64_t>(gm.k);
          pr.rowLayout = mk::GroupedRowLayout::Packed;
          pr.maxRows = static_cast<int64_t>(tokens);
          pr.rowCounts = dCounts;
          pr.a = dA;
          pr.lda = static_cast<int64_t>(gm.k);
          pr.b = bPtrs.data();
          pr.layoutB = colMajor ? mk::GemmLayout::ColMajor : mk::GemmLayout::RowMajor;
          pr.ldb = static_cast<int64_t>(colMajor ? gm.k : gm.n);
          pr.c = dC;
          pr.ldc = static_cast<int64_t>(outCols);
          pr.swiglu = gm.swiglu;
          mk::GroupedGemmConfig cfg;
          cfg.epilogue = a.epilogue == "direct" ? mk::GemmEpilogue::Direct : mk::GemmEpilogue::TmaStore;
          mk::GroupedGemmPlan plan(pr, cfg);
          const double us = timeLoop([&] { plan.run(stream); }, a, stream, ev0, ev1);
          const uint64_t bad = spotCheck(gm, counts, dA, dW, colMajor, dC, 64, ++seed);
          badTotal += bad;
          // The layered baseline: one cuBLASLt matmul per expert with rows (the plain GEMM; for "up" without the
          // SwiGLU, into 2F columns), into its own buffer.
          double theirsUs = 0;
          if (lt) {
            try {
              std::vector<CublasLt::Plan> plans;
              uint64_t start = 0;
              for (uint64_t e = 0; e < experts; ++e) {
                const auto rowsE = static_cast<uint64_t>(counts[e]);
                if (rowsE > 0) {
                  mk::GemmProblem q;
                  q.m = static_cast<int64_t>(rowsE);
                  q.n = static_cast<int64_t>(gm.n);
                  q.k = static_cast<int64_t>(gm.k);
                  q.a = dA + start * gm.k;
                  q.lda = static_cast<int64_t>(gm.k);
                  q.b = bPtrs[e];
                  q.ldb = pr.ldb;
                  q.layoutB = pr.layoutB;
                  q.c = dBase + start * gm.n;
                  q.ldc = static_cast<int64_t>(gm.n);
                  plans.push_back(lt->plan(q));
                }
                start += rowsE;
              }
              theirsUs = timeLoop(
                  [&] {
                    for (const CublasLt::Plan& pl : plans) lt->run(pl, stream);
                  },
                  a, stream, ev0, ev1);
            } catch (const mk::Error& e) {  // no algorithm for a shape: the row has no baseline
              std::printf("# cuBLASLt baseline skipped (%s)\n", e.what());
              theirsUs = 0;
            }
          }
          const double flops = 2.0 * static_cast<double>(tokens) * static_cast<double>(gm.n * gm.k);
          const double tflops = flops / us * 1e-6;
          const auto [minIt, maxIt] = std::minmax_element(counts.begin(), counts.end());
          std::printf("%8llu %9s %5s %9d %9d %10s %12.2f %10.1f %12.2f %9.3f %8llu\n",
                      static_cast<unsigned long long>(tokens), routing.c_str(), gm.name, *minIt, *maxIt,
                      mk::toString(plan.epilogue()), us, tflops, theirsUs, theirsUs > 0 ? theirsUs / us : 0.0,
                      static_cast<unsigned long long>(bad));
          std::fflush(stdout);
          mk::MeasurementRecord rec;
          rec.op = "grouped-gemm";
          rec.impl = "mkernel";
          rec.algo = std::string(gm.swiglu ? "wgmma-tma-ws-grouped-swiglu-" : "wgmma-tma-ws-grouped-") +
                     mk::toString(plan.epilogue());
          rec.dtype = "bfloat16";
          rec.ranks = 1;
          rec.bytes = tokens * gm.k * 2 + experts * gm.n * gm.k * 2 + tokens * outCols * 2;
          rec.timeUs = us;
          rec.algbwGBs = static_cast<double>(rec.bytes) / us * 1e-3;
          rec.iters = a.iters;
          rec.stat = "median";
          rec.extra["gemm"] = mkbench::quoted(gm.name);
          rec.extra["tokens"] = std::to_string(tokens);
          rec.extra["routing"] = mkbench::quoted(routing);
          rec.extra["experts"] = std::to_string(experts);
          rec.extra["n"] = std::to_string(gm.n);
          rec.extra["k"] = std::to_string(gm.k);
          rec.extra["swiglu"] = gm.swiglu ? "true" : "false";
          rec.extra["layout_b"] = mkbench::quoted(a.layoutB);
          rec.extra["row_layout"] = mkbench::quoted("packed");
          rec.extra["min_rows"] = std::to_string(*minIt);
          rec.extra["max_rows"] = std::to_string(*maxIt);
          rec.extra["sms"] = std::to_string(sms);
          rec.extra["ctas"] = std::to_string(plan.ctas());
          rec.extra["epilogue"] = mkbench::quoted(mk::toString(plan.epilogue()));
          rec.extra["flops"] = mk::strprintf("%.0f", flops);
          rec.extra["tflops"] = mk::strprintf("%.3f", tflops);
          rec.extra["spot_wrong"] = std::to_string(bad);
          file.records.push_back(rec);
          if (theirsUs > 0) {
            mk::MeasurementRecord base = rec;
            base.impl = "cublaslt";
            base.algo = "per-expert-loop";  // the GEMM alone: no SwiGLU, 2F columns written for "up"
            base.bytes = tokens * gm.k * 2 + experts * gm.n * gm.k * 2 + tokens * gm.n * 2;
            base.timeUs = theirsUs;
            base.algbwGBs = static_cast<double>(base.bytes) / theirsUs * 1e-3;
            base.extra["swiglu"] = "false";
            base.extra["tflops"] = mk::strprintf("%.3f", flops / theirsUs * 1e-6);
            base.extra["cublaslt"] = mkbench::quoted(lt->version());
            for (const char* key : {"ctas", "epilogue", "spot_wrong"}) base.extra.erase(key);
            file.records.push_back(base);
          }
        }
      cudaFree(dA);
      cudaFree(dW);
      cudaFree(dC);
      cudaFree(dCounts);
      cudaFree(dBase);
    }
    cudaEventDestroy(ev0);
    cudaEventDestroy(ev1);
    cudaStreamDestroy(stream);
    if (!a.json.empty()) mk::saveMeasurementFile(file, a.json);
    if (badTotal > 0) {
      std::fprintf(stderr, "mk-bench grouped-gemm: %llu sampled outputs wrong\n",
                   static_cast<unsigned long long>(badTotal));
      return 1;
    }
    return 0;
  } catch (const mk::Error& e) {  // no GPU 3, driver too old 4, the rest 2 (mk/util/cli.hpp)
    std::fprintf(stderr, "mk-bench grouped-gemm: %s\n", e.what());
    return mk::cli::exitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mk-bench grouped-gemm: %s\n", e.what());
    return 2;
  }
}

}  // namespace mkbench

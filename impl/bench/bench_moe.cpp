// mk-bench moe-ffn: a MoE layer's expert FFN on the resident kernel (Communicator::moeFfn; docs/fused-operators.md,
// "MoE FFN") against the layered program a framework runs, ranks of one process on this machine's GPUs.
//
//   mk-bench moe-ffn [--ranks R] [--experts E] [--topk K] [--tokens 4096,...] [--hidden H] [--ffn F]
//                    [--routing uniform|skewed|both] [--compute-weight W] [--baseline-ctas C]
//                    [--iters I] [-w W] [--reps N] [--check] [--json f]
//
// Ranks: R ranks of this process on the visible GPUs in turn (more ranks than GPUs share them). E experts on every
// rank, every token routed to K distinct experts (mk::moeRouting: uniform, or skewed: every token the same K), T
// tokens of H features per rank, expert FFN of intermediate size F (SwiGLU), bf16 weights and tokens, float32 output.
// The GPU engine runs moe-ffn on one node, so there is no one-process-per-rank mode.
//
// Columns (medians over --reps loops of --iters calls, CUDA events, the slowest rank's stream):
//  * lanes: rank 0's worker CTAs in the compute lane / in its other lanes (the lowered program's split);
//  * fused_us: Communicator::moeFfn on a compute-capable communicator: route, dispatch, both grouped GEMMs and the
//    return in one resident-kernel op, the GEMMs of a source's rows starting as soon as they arrived;
//  * layered_us: the same schedule cut where a framework cuts it (mk::generateMoeFfnLayered), on a
//    communication-only communicator of --baseline-ctas worker CTAs (the GEMM kernels get the other SMs): the
//    dispatch op (route, notify, gathers, puts), then the standalone grouped GEMM engine twice (up with SwiGLU over
//    every (source, expert) block at the counts the dispatch wrote, then down), then the return-and-combine op, one
//    after the other on each rank's stream;
//  * dispatch_us / gemm_us / combine_us: each part of the layered program alone; speedup = layered_us / fused_us;
//    TFLOP/s = the layer's 6 T K H F per rank over fused_us.
// --check: every element of every rank's fused y against the layered program's (|d| <= 1e-3 (1 + |y|)); both against
// a double reference is mk_moe_gpu_tests.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "bench_launch.hpp"
#include "fused_baseline.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/communicator.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device_info.hpp"
#include "mk/error.hpp"
#include "mk/exec/verify_moe.hpp"
#include "mk/grouped_gemm.hpp"
#include "mk/io/measurement.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/format.hpp"

namespace mkbench {
namespace {

struct Args {
  uint32_t ranks = 0, experts = 8, topk = 8, hidden = 7168, ffn = 2048, computeWeight = 8, baselineCtas = 8;
  std::vector<uint32_t> tokens{4096};
  std::string routing = "uniform", json;
  bool check = false;
  uint64_t iters = 5, warmup = 2, reps = 5;
};

/// One rank's memory: the layer's inputs, the fused op's y, and the layered program's counts, blocks and y.
struct RankMem {
  Dev ids, weights, x, w1, w2, y, counts, recv, h, o, yLayered;
  RankMem(const mk::MoeFfnSpec& s, uint32_t G)
      : ids(uint64_t{s.tokens} * s.topk * 4),
        weights(uint64_t{s.tokens} * s.topk * 4),
        x(uint64_t{s.tokens} * s.hidden * 2),
        w1(uint64_t{s.experts} * s.hidden * 2 * s.ffn * 2),
        w2(uint64_t{s.experts} * s.ffn * s.hidden * 2),
        y(uint64_t{s.tokens} * s.hidden * 4),
        counts(uint64_t{G} * 4),
        recv(uint64_t{G} * s.capacityOr() * s.hidden * 2),
        h(uint64_t{G} * s.capacityOr() * s.ffn * 2),
        o(uint64_t{G} * s.capacityOr() * s.hidden * 4),
        yLayered(uint64_t{s.tokens} * s.hidden * 4) {}
};

/// The layered program of this process's ranks (mk::generateMoeFfnLayered): dispatch op, two grouped GEMMs, combine op.
struct LayeredProgram {
  const Launch& launch;
  std::vector<std::unique_ptr<RankMem>>& mem;
  Streams& st;
  mk::MoeFfnLayered ops;
  std::vector<mk::GroupedGemmPlan> up, down;  ///< per local rank

  LayeredProgram(const Launch& l, std::vector<std::unique_ptr<RankMem>>& m, Streams& s, const mk::MoeFfnSpec& spec,
                 const std::vector<uint32_t>& nodeOf, int64_t gemmCtas)
      : launch(l), mem(m), st(s), ops(mk::generateMoeFfnLayered(spec, nodeOf)) {
    const auto R = static_cast<uint32_t>(nodeOf.size());
    const uint32_t E = spec.experts, G = R * E, H = spec.hidden, F = spec.ffn, C = spec.capacityOr();
    mk::GroupedGemmConfig cfg;
    cfg.ctas = gemmCtas;
    for (std::size_t i = 0; i < launch.devs.size(); ++i) {
      MK_CUDA_CHECK(cudaSetDevice(launch.devs[i]));
      const RankMem& r = *mem[i];
      // Group g = source x E + expert: block g of recv / h / o, expert g % E's weights.
      std::vector<const void*> b1(G), b2(G);
      for (uint32_t g = 0; g < G; ++g) {
        b1[g] = r.w1.c() + uint64_t{g % E} * H * 2 * F * 2;
        b2[g] = r.w2.c() + uint64_t{g % E} * F * H * 2;
      }
      mk::GroupedGemmProblem p;
      p.groups = G;
      p.maxRows = C;
      p.rowCounts = static_cast<const int32_t*>(r.counts.p);
      p.n = 2 * F;
      p.k = H;
      p.a = r.recv.p;
      p.lda = H;
      p.b = b1.data();
      p.ldb = 2 * F;
      p.c = r.h.p;
      p.ldc = F;
      p.outDType = mk::DType::BFloat16;
      p.swiglu = true;
      up.emplace_back(p, cfg);
      p.n = H;
      p.k = F;
      p.a = r.h.p;
      p.lda = F;
      p.b = b2.data();
      p.ldb = H;
      p.c = r.o.p;
      p.ldc = H;
      p.outDType = mk::DType::Float32;
      p.swiglu = false;
      down.emplace_back(p, cfg);
    }
  }
  void dispatch(std::vector<mk::Communicator>& comms) {
    mk::groupStart();
    for (std::size_t i = 0; i < comms.size(); ++i) {
      const RankMem& m = *mem[i];
      comms[i].execute(ops.dispatch, {m.ids.p, m.x.p}, {m.counts.p, m.recv.p}, st.s[i]);
    }
    mk::groupEnd();
  }
  void gemms() {
    for (std::size_t i = 0; i < up.size(); ++i) {
      MK_CUDA_CHECK(cudaSetDevice(launch.devs[i]));
      up[i].run(st.s[i]);
      down[i].run(st.s[i]);
    }
  }
  void combine(std::vector<mk::Communicator>& comms) {
    mk::groupStart();
    for (std::size_t i = 0; i < comms.size(); ++i) {
      const RankMem& m = *mem[i];
      comms[i].execute(ops.combine, {m.ids.p, m.counts.p, m.weights.p, m.o.p}, {m.yLayered.p}, st.s[i]);
    }
    mk::groupEnd();
  }
  /// One whole layer: what a framework runs.
  void run(std::vector<mk::Communicator>& comms) {
    dispatch(comms);
    gemms();
    combine(comms);
  }
};

/// Router weights uniform in [0, 1) on the device.
void uploadWeights(void* dst, uint64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::vector<float> w(count);
  for (float& v : w) v = unit(rng);
  MK_CUDA_CHECK(cudaMemcpy(dst, w.data(), count * 4, cudaMemcpyHostToDevice));
}

}  // namespace

int moeFfnMain(int argc, char** argv, const std::string& command) {
  Args a;
  CLI::App app{"mk-bench moe-ffn: a MoE layer's expert FFN on the resident kernel against the layered program"};
  app.add_option("--ranks", a.ranks, "ranks of this process (default: one per visible GPU); more than the GPUs share")
      ->check(CLI::PositiveNumber);
  app.add_option("--experts", a.experts, "experts on every rank")->check(CLI::PositiveNumber);
  app.add_option("--topk", a.topk, "experts per token (at most ranks x experts)")->check(CLI::PositiveNumber);
  app.add_option("--tokens", a.tokens, "tokens per rank")->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--hidden", a.hidden, "features of a token, a multiple of 8")->check(CLI::PositiveNumber);
  app.add_option("--ffn", a.ffn, "intermediate size of an expert, a multiple of 8")->check(CLI::PositiveNumber);
  app.add_option("--routing", a.routing,
                 "uniform (distinct experts drawn uniformly), skewed (every token the same), both")
      ->check(CLI::IsMember({"uniform", "skewed", "both"}));
  app.add_option("--compute-weight", a.computeWeight,
                 "the compute lane's weight against every other lane's 1 when the fused op's CTAs are split")
      ->check(CLI::PositiveNumber);
  app.add_option("--baseline-ctas", a.baselineCtas,
                 "worker CTAs of the layered program's communication-only communicator (its GEMMs get the rest)")
      ->check(CLI::PositiveNumber);
  app.add_option("--iters", a.iters, "calls per timed loop")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup", a.warmup, "untimed calls before timing");
  app.add_option("--reps", a.reps, "timed loops; the median is reported")->check(CLI::PositiveNumber);
  app.add_flag("--check", a.check, "compare every output element of the fused op with the layered program's");
  app.add_option("--json", a.json, "write measurement records (mkernel.measurement.v1) to this file, atomically");
  if (int rc = mk::cli::parse(app, argc, argv, "mk-bench moe-ffn"); rc != mk::cli::kContinue) return rc;
  try {
    const int available = mk::requireCudaDevices();
    if (mk::launchedAsRanks())
      throw mk::Error(mk::ErrorCode::Unsupported,
                      "moe-ffn runs its ranks in one process (the GPU engine runs moe-ffn on one node): start it "
                      "once, with --ranks");
    std::vector<int> devs;
    const uint32_t R = a.ranks ? a.ranks : static_cast<uint32_t>(available);
    for (uint32_t r = 0; r < R; ++r) devs.push_back(static_cast<int>(r % static_cast<uint32_t>(available)));
    const Launch launch = launchLocal(std::move(devs));
    const std::size_t local = launch.devs.size();
    const bool shared = R > static_cast<uint32_t>(available);
    mk::CommConfig fusedCfg, layeredCfg;
    fusedCfg.shareGpus = layeredCfg.shareGpus = shared;
    fusedCfg.computeLanes = true;
    layeredCfg.workerCtas = a.baselineCtas;
    cudaDeviceProp prop{};
    MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, launch.devs[0]));
    // The layered GEMMs run beside every resident kernel of their GPU (its workers and its control CTA).
    const uint32_t ranksPerGpu = (R + static_cast<uint32_t>(available) - 1) / static_cast<uint32_t>(available);
    const int64_t gemmCtas =
        std::max<int64_t>(1, prop.multiProcessorCount - int64_t{ranksPerGpu} * (a.baselineCtas + 1));
    std::vector<mk::MoeRouting> routings;
    if (a.routing != "skewed") routings.push_back(mk::MoeRouting::Uniform);
    if (a.routing != "uniform") routings.push_back(mk::MoeRouting::Skewed);
    std::printf(
        "# mk-bench moe-ffn: %u rank(s) on %s (%d SMs)%s, bf16, E %u per rank, topk %u, H %u, F %u, iters %llu, "
        "reps %llu\n",
        R, prop.name, prop.multiProcessorCount, shared ? ", ranks SHARE the GPU" : "", a.experts, a.topk, a.hidden,
        a.ffn, static_cast<unsigned long long>(a.iters), static_cast<unsigned long long>(a.reps));
    std::printf("%8s %8s %8s %11s %11s %11s %10s %11s %8s %8s %6s\n", "T", "routing", "lanes", "fused_us", "layered_us",
                "dispatch_us", "gemm_us", "combine_us", "speedup", "TFLOPs", "check");
    mk::MeasurementFile file = newMeasurementFile(available, "", command);
    const uint64_t seed = std::random_device{}();
    int rc = 0;
    for (const uint32_t T : a.tokens)
      for (const mk::MoeRouting routing : routings) {
        mk::MoeFfnSpec spec;
        spec.experts = a.experts;
        spec.topk = a.topk;
        spec.tokens = T;
        spec.hidden = a.hidden;
        spec.ffn = a.ffn;
        spec.computeCtas = a.computeWeight;
        mk::validateMoeFfnSpec(spec, R);
        const uint32_t G = R * a.experts;
        const mk::MoeIds ids = mk::moeRouting(spec.dispatch(), R, routing, seed);
        std::vector<std::unique_ptr<RankMem>> mem;
        for (std::size_t i = 0; i < local; ++i) {
          MK_CUDA_CHECK(cudaSetDevice(launch.devs[i]));
          mem.push_back(std::make_unique<RankMem>(spec, G));
          RankMem& m = *mem[i];
          MK_CUDA_CHECK(cudaMemcpy(m.ids.p, ids[i].data(), ids[i].size() * 4, cudaMemcpyHostToDevice));
          uploadWeights(m.weights.p, uint64_t{T} * a.topk, seed + 4 * i);
          fillRandomBf16(m.x.p, uint64_t{T} * a.hidden, seed + 4 * i + 1);
          fillRandomBf16(m.w1.p, uint64_t{a.experts} * a.hidden * 2 * a.ffn, seed + 4 * i + 2);
          fillRandomBf16(m.w2.p, uint64_t{a.experts} * a.ffn * a.hidden, seed + 4 * i + 3);
        }
        Streams st(launch.devs);
        const BaselineTiming timing{a.iters, a.warmup, a.reps};
        // ---- fused: Communicator::moeFfn
        double fusedUs = 0;
        std::vector<uint32_t> nodeOf;
        uint32_t computeCtas = 0, otherCtas = 0;
        {
          std::vector<mk::Communicator> comms = createCommunicators(launch, fusedCfg);
          nodeOf = comms[0].topology().layout(R);
          fusedUs = timeLoopUs(timing, st, true, [&] {
            for (std::size_t i = 0; i < local; ++i) {
              const RankMem& m = *mem[i];
              comms[i].moeFfn(spec, static_cast<const int32_t*>(m.ids.p), static_cast<const float*>(m.weights.p), m.x.p,
                              m.w1.p, m.w2.p, static_cast<float*>(m.y.p), st.s[i]);
            }
          });
          st.sync();
          const mk::MoeFfnPlan plan = comms[0].moeFfnPlan(spec);
          computeCtas = plan.computeCtas;
          otherCtas = plan.otherCtas;
        }
        // ---- layered: dispatch, standalone grouped GEMMs, combine; the whole program timed last, so that its last
        // call leaves a complete y for the check.
        double layeredUs = 0, dispatchUs = 0, gemmUs = 0, combineUs = 0;
        {
          std::vector<mk::Communicator> comms = createCommunicators(launch, layeredCfg);
          LayeredProgram layered(launch, mem, st, spec, nodeOf, gemmCtas);
          dispatchUs = timeLoopUs(timing, st, false, [&] { layered.dispatch(comms); });
          gemmUs = timeLoopUs(timing, st, false, [&] { layered.gemms(); });
          combineUs = timeLoopUs(timing, st, false, [&] { layered.combine(comms); });
          layeredUs = timeLoopUs(timing, st, false, [&] { layered.run(comms); });
          st.sync();
        }
        // ---- check, report
        uint64_t bad = 0;
        double worst = 0;
        if (a.check) {
          for (std::size_t i = 0; i < local; ++i) {
            const uint64_t n = uint64_t{T} * a.hidden;
            std::vector<float> f(n), l(n);
            MK_CUDA_CHECK(cudaMemcpy(f.data(), mem[i]->y.p, n * 4, cudaMemcpyDeviceToHost));
            MK_CUDA_CHECK(cudaMemcpy(l.data(), mem[i]->yLayered.p, n * 4, cudaMemcpyDeviceToHost));
            for (uint64_t j = 0; j < n; ++j) {
              const double e = std::fabs(double{f[j]} - l[j]), tol = 1e-3 * (1 + std::fabs(double{l[j]}));
              const double ratio = std::isfinite(e) ? e / tol : 1e30;
              worst = std::max(worst, ratio);
              bad += ratio > 1;
            }
          }
          if (bad != 0) rc = 1;
        }
        // Rows rank 0 sends to other ranks (one per (token, k) naming another rank's expert) and the layer's flops.
        uint64_t remoteRows = 0;
        for (uint64_t j = 0; j < ids[0].size(); ++j) remoteRows += static_cast<uint32_t>(ids[0][j]) / a.experts != 0;
        const double flops = 6.0 * T * a.topk * a.hidden * a.ffn, tflops = flops / fusedUs * 1e-6;
        const char* routingName = routing == mk::MoeRouting::Uniform ? "uniform" : "skewed";
        const std::string lanes = std::to_string(computeCtas) + "/" + std::to_string(otherCtas);
        std::printf("%8u %8s %8s %11.1f %11.1f %11.1f %10.1f %11.1f %8.2f %8.1f %6s\n", T, routingName, lanes.c_str(),
                    fusedUs, layeredUs, dispatchUs, gemmUs, combineUs, layeredUs / fusedUs, tflops,
                    !a.check   ? "-"
                    : bad == 0 ? "ok"
                               : "FAIL");
        std::fflush(stdout);
        mk::MeasurementRecord rec;
        rec.op = "moe-ffn";
        rec.impl = "mkernel";
        rec.algo = "direct";
        rec.dtype = "bfloat16";
        rec.ranks = R;
        rec.bytes = remoteRows * a.hidden * 2;  // rank 0's token rows dispatched to other ranks per call
        rec.timeUs = fusedUs;
        rec.algbwGBs = static_cast<double>(rec.bytes) / fusedUs * 1e-3;
        rec.iters = a.iters;
        rec.stat = "median";
        rec.extra["experts"] = std::to_string(a.experts);
        rec.extra["topk"] = std::to_string(a.topk);
        rec.extra["tokens"] = std::to_string(T);
        rec.extra["hidden"] = std::to_string(a.hidden);
        rec.extra["ffn"] = std::to_string(a.ffn);
        rec.extra["capacity"] = std::to_string(spec.capacityOr());
        rec.extra["routing"] = mkbench::quoted(routingName);
        rec.extra["shared_gpu"] = shared ? "true" : "false";
        rec.extra["layered_us"] = mk::strprintf("%.3f", layeredUs);
        rec.extra["dispatch_us"] = mk::strprintf("%.3f", dispatchUs);
        rec.extra["gemm_us"] = mk::strprintf("%.3f", gemmUs);
        rec.extra["combine_us"] = mk::strprintf("%.3f", combineUs);
        rec.extra["speedup"] = mk::strprintf("%.4f", layeredUs / fusedUs);
        rec.extra["compute_ctas"] = std::to_string(computeCtas);
        rec.extra["other_ctas"] = std::to_string(otherCtas);
        rec.extra["compute_weight"] = std::to_string(a.computeWeight);
        rec.extra["baseline_ctas"] = std::to_string(a.baselineCtas);
        rec.extra["layered_gemm_ctas"] = std::to_string(gemmCtas);
        rec.extra["flops"] = std::to_string(static_cast<uint64_t>(flops));
        rec.extra["tflops_per_rank"] = mk::strprintf("%.3f", tflops);
        if (a.check) {
          rec.extra["check"] = bad == 0 ? "true" : "false";
          rec.extra["worst_error_over_tolerance"] = mk::strprintf("%.4f", worst);
        }
        file.records.push_back(rec);
      }
    if (!a.json.empty()) mk::saveMeasurementFile(file, a.json);
    return rc;
  } catch (const mk::Error& e) {
    std::fprintf(stderr, "mk-bench moe-ffn: %s\n", e.what());
    return mk::cli::exitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mk-bench moe-ffn: %s\n", e.what());
    return 2;
  }
}

}  // namespace mkbench

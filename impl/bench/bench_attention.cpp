// mk-bench attention: the attention forward engine (mk/attention.hpp) timed on the shapes of issue 38.
//
//   mk-bench attention [--seq 768,1024,...] [--iters N] [--reps R] [--json f] [--calib]
//
// Shapes: B 4, D 128, sequence S per GPU (sq = skv = S, positions from 0) with 16 / 16 heads and Llama-style GQA
// 32 / 8 heads, causal and not. Timing: `warmup` launches, then `reps` loops of `iters` launches between two CUDA
// events; reported time = median over the loops of (loop time / iters). TFLOP/s counts the unmasked pairs only:
// 4 x B x Hq x D x pairs (attentionFlops). The PyTorch SDPA baselines (cuDNN, flash) are
// validation/tools/attention_bench.py, same shapes and timing, run in the same device session.
// --calib: the records are calib-attention micro-benchmarks for mk-calibrate (attentionTflops; docs/calibration.md),
// timed with the dynamic unit split (a counter) the resident kernel's compute lane runs too.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "mk/attention.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/format.hpp"

namespace mkbench {
namespace {

struct Args {
  std::vector<uint32_t> seq{768, 1024, 2048, 4096, 8192, 16384};
  uint32_t batch = 4;
  uint64_t iters = 10, reps = 5, warmup = 2;
  std::string json, units = "dynamic";
  bool calib = false;
};

struct Config {
  uint32_t hq, hkv;
  bool causal;
};

}  // namespace

int attentionMain(int argc, char** argv, const std::string& command) {
  Args a;
  CLI::App app{"mk-bench attention: the attention forward engine (B x S x H x 128, bf16) timed per shape"};
  app.add_option("--seq", a.seq, "sequence lengths per GPU (sq = skv)")->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("-b,--batch", a.batch, "batch")->check(CLI::PositiveNumber);
  app.add_option("--json", a.json, "write measurement records (mkernel.measurement.v1) to this file, atomically");
  app.add_option("--units", a.units,
                 "how CTAs take work units: dynamic (the default: drawn from a counter), static (a fixed split), or "
                 "all (both)")
      ->check(CLI::IsMember({"dynamic", "static", "all"}));
  app.add_flag("--calib", a.calib,
               "write calib-attention records for mk-calibrate (attentionTflops) instead of attention-fwd; units "
               "dynamic, the compute lane's split");
  app.add_option("--iters", a.iters, "launches per timed loop")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup", a.warmup, "untimed launches before timing");
  app.add_option("--reps", a.reps, "timed loops; the median is reported")->check(CLI::PositiveNumber);
  if (int rc = mk::cli::parse(app, argc, argv, "mk-bench attention"); rc != mk::cli::kContinue) return rc;
  if (a.calib) {
    if (app.count("--units") > 0 && a.units != "dynamic") {
      std::fprintf(stderr,
                   "mk-bench attention: --calib times the dynamic unit split (the resident kernel's); "
                   "drop --units %s\n",
                   a.units.c_str());
      return 2;
    }
    a.units = "dynamic";
  }
  const std::vector<Config> configs{{16, 16, false}, {16, 16, true}, {32, 8, false}, {32, 8, true}};
  try {
    MK_CUDA_CHECK(cudaSetDevice(0));
    int sms = 0;
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t stream = nullptr;
    cudaEvent_t ev0 = nullptr, ev1 = nullptr;
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    MK_CUDA_CHECK(cudaEventCreate(&ev0));
    MK_CUDA_CHECK(cudaEventCreate(&ev1));
    uint32_t* counter = nullptr;  // AttentionOptions::unitCounter: zeroed once, each call leaves it zero
    MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&counter), sizeof(uint32_t)));
    MK_CUDA_CHECK(cudaMemset(counter, 0, sizeof(uint32_t)));
    std::vector<bool> dynamicModes;
    if (a.units != "static") dynamicModes.push_back(true);
    if (a.units != "dynamic") dynamicModes.push_back(false);
    std::printf("# mk-bench attention: GPU 0 (%d SMs), bf16, D 128, B %u, iters %llu, reps %llu\n", sms, a.batch,
                static_cast<unsigned long long>(a.iters), static_cast<unsigned long long>(a.reps));
    std::printf("%6s %4s %4s %6s %8s %12s %12s %10s\n", "S", "hq", "hkv", "causal", "units", "ours_us", "TFLOPs",
                "nonfinite");
    mk::MeasurementFile file = newMeasurementFile(1, "", command);
    uint64_t seed = std::random_device{}();
    for (uint32_t s : a.seq)
      for (const Config& c : configs) {
        mk::AttentionShape sh;
        sh.batch = a.batch;
        sh.qHeads = c.hq;
        sh.kvHeads = c.hkv;
        sh.headDim = 128;
        sh.sq = sh.skv = sh.ldq = sh.ldkv = sh.ldo = s;
        sh.causal = c.causal;
        sh.scale = mk::defaultAttentionScale(128);
        const uint64_t qCount = uint64_t{a.batch} * s * c.hq * 128, kCount = uint64_t{a.batch} * s * c.hkv * 128;
        const uint64_t outCount = uint64_t{a.batch} * s * c.hq * 129;
        sh.vOffset = kCount;
        void *q = nullptr, *kv = nullptr;
        float* out = nullptr;
        MK_CUDA_CHECK(cudaMalloc(&q, qCount * 2));
        MK_CUDA_CHECK(cudaMalloc(&kv, 2 * kCount * 2));
        MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), outCount * 4));
        fillRandomBf16(q, qCount, ++seed);
        fillRandomBf16(kv, 2 * kCount, ++seed);
        for (bool dynamic : dynamicModes) {
          mk::AttentionOptions opt;
          opt.dynamicUnits = dynamic;
          opt.unitCounter = counter;
          for (uint64_t i = 0; i < a.warmup; ++i)
            mk::attentionForward(sh, mk::DType::BFloat16, q, kv, out, stream, opt);
          std::vector<double> samples;
          for (uint64_t r = 0; r < a.reps; ++r) {
            MK_CUDA_CHECK(cudaEventRecord(ev0, stream));
            for (uint64_t i = 0; i < a.iters; ++i)
              mk::attentionForward(sh, mk::DType::BFloat16, q, kv, out, stream, opt);
            MK_CUDA_CHECK(cudaEventRecord(ev1, stream));
            MK_CUDA_CHECK(cudaEventSynchronize(ev1));
            float ms = 0;
            MK_CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
            samples.push_back(1000.0 * ms / static_cast<double>(a.iters));
          }
          // A plain sanity count (the element-wise check is mk_attention_gpu_tests): output values that are not
          // finite, the log-sum-exp column included (no row is masked whole here).
          std::vector<float> host(outCount);
          MK_CUDA_CHECK(cudaMemcpy(host.data(), out, outCount * 4, cudaMemcpyDeviceToHost));
          uint64_t nonFinite = 0;
          for (float v : host) nonFinite += !std::isfinite(v);
          const double us = median(samples), flops = mk::attentionFlops(sh), tflops = flops / us * 1e-6;
          std::printf("%6u %4u %4u %6s %8s %12.2f %12.1f %10llu\n", s, c.hq, c.hkv, c.causal ? "yes" : "no",
                      dynamic ? "dynamic" : "static", us, tflops, static_cast<unsigned long long>(nonFinite));
          std::fflush(stdout);
          mk::MeasurementRecord rec;
          rec.op = a.calib ? "calib-attention" : "attention-fwd";
          rec.impl = "mkernel";
          rec.algo = "wgmma-tma-ws";
          rec.dtype = "bfloat16";
          rec.ranks = 1;
          rec.bytes = (qCount + 2 * kCount) * 2 + outCount * 4;
          rec.timeUs = us;
          rec.algbwGBs = static_cast<double>(rec.bytes) / us * 1e-3;
          rec.iters = a.iters;
          rec.stat = "median";
          rec.extra["batch"] = std::to_string(a.batch);
          rec.extra["seq"] = std::to_string(s);
          rec.extra["sq"] = std::to_string(s);
          rec.extra["skv"] = std::to_string(s);
          rec.extra["q_heads"] = std::to_string(c.hq);
          rec.extra["kv_heads"] = std::to_string(c.hkv);
          rec.extra["head_dim"] = "128";
          rec.extra["causal"] = c.causal ? "true" : "false";
          rec.extra["sms"] = std::to_string(sms);
          rec.extra["flops"] = std::to_string(static_cast<uint64_t>(flops));
          rec.extra["tflops"] = mk::strprintf("%.3f", tflops);
          rec.extra["nonfinite"] = std::to_string(nonFinite);
          rec.extra["units"] = mkbench::quoted(dynamic ? "dynamic" : "static");
          file.records.push_back(rec);
        }
        cudaFree(q);
        cudaFree(kv);
        cudaFree(out);
      }
    cudaFree(counter);
    cudaEventDestroy(ev0);
    cudaEventDestroy(ev1);
    cudaStreamDestroy(stream);
    if (!a.json.empty()) mk::saveMeasurementFile(file, a.json);
    return 0;
  } catch (const mk::Error& e) {  // no GPU 3, driver too old 4, the rest 2 (mk/util/cli.hpp)
    std::fprintf(stderr, "mk-bench attention: %s\n", e.what());
    return mk::cli::exitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mk-bench attention: %s\n", e.what());
    return 2;
  }
}

}  // namespace mkbench

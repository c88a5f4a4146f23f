// mk-bench gemm — the Hopper GEMM engine (mk::GemmPlan) against cuBLASLt on one GPU (GPU 0).
//
//   mk-bench gemm -m M -n N -k K [--ctas C] [--layout-b row|col] [--out bf16|f32] [--check] [--json f]
//                 [--iters I] [-w W] [--reps R] [--shapes reference] [--epilogue direct|tma-store]
//                 [--split-k S] [--schedule auto|tiles|stream-k] [--engine standalone|resident|both]
//
// --engine resident (or both): the same GEMM also as a one-Gemm-step schedule run by the resident kernel of a
// 1-GPU communicator created with CommConfig::computeLanes (the compute lanes, docs/gemm.md "Inside the
// resident kernel"): `iters` execute() calls in one group between the events, so the time includes the
// engine's per-op cost (doorbell, publish, completion); the lane gets --ctas worker CTAs (0 = every SM but
// the control block's). Its row says "resident" and its JSON record has extra.engine = "resident".
//
// Timing (as the rest of mk-bench): CUDA events around `iters` back-to-back launches on one stream after
// `warmup` launches; reported time = median over `reps` such loops of (loop time / iters). cuBLASLt runs
// with the same buffers and loop right after ours, always on every SM. Inputs are fresh uniform [-1, 1)
// bf16 values for every shape.
//
// --check: relative Frobenius error ||C - Cref|| / ||Cref|| of ours against cuBLASLt's result on the same
// inputs. Bound: u_out + 2 K 2^-24, where u_out = 2^-8 for bf16 output (each side rounds once to bf16, at
// most 2^-9 relative each) and 0 for fp32, and 2 K 2^-24 covers two fp32 accumulations of K products in
// different orders (the classic gamma_K bound, for both sides). Any NaN or Inf fails.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "cublaslt_loader.hpp"
#include "lowering/lowering.hpp"
#include "mk/communicator.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device/compute_lane_device.hpp"
#include "mk/error.hpp"
#include "mk/gemm.hpp"
#include "mk/io/measurement.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/format.hpp"

namespace mkbench {
namespace {

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  int64_t ctas = 0;
  std::string layoutB = "row", out = "bf16", shapes, json;
  bool check = false;
  uint64_t iters = 20, warmup = 5, reps = 5;
  int64_t groupM = 8;
  int64_t tileN = 0;
  std::string epilogue = "tma-store";
  int64_t splitK = 1;
  std::string schedule = "auto";
  std::string engine = "standalone";
};

struct Shape {
  int64_t m, n, k, ctas;
};

/// The reference table (--shapes reference): square-ish b x b x b/2, tensor-parallel M x 8192 x 14336, skinny M x 8192
/// x 8192; every shape with all SMs (ctas 0) and with 116 (16 SMs left to communication).
std::vector<Shape> referenceShapes() {
  std::vector<Shape> base;
  for (int64_t b : {2048, 4096, 8192, 16384}) base.push_back({b, b, b / 2, 0});
  for (int64_t m : {1024, 4096, 16384}) base.push_back({m, 8192, 14336, 0});
  for (int64_t m : {128, 512}) base.push_back({m, 8192, 8192, 0});
  std::vector<Shape> all;
  for (const Shape& s : base) {
    all.push_back(s);
    all.push_back({s.m, s.n, s.k, 116});
  }
  return all;
}

/// Device buffer freed on scope exit.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { MK_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

uint16_t floatToBf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even (inputs are finite)
  return static_cast<uint16_t>(u >> 16);
}
float bf16ToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Uniform [-1, 1) bf16 values (splitmix64: fast enough for the 235 M-element operands of the table).
void fillRandom(void* dev, std::size_t count, uint64_t seed, cudaStream_t stream) {
  std::vector<uint16_t> host(count);
  uint64_t x = seed;
  for (std::size_t i = 0; i < count; ++i) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    host[i] = floatToBf16(2.0f * u - 1.0f);
  }
  MK_CUDA_CHECK(cudaMemcpyAsync(dev, host.data(), count * 2, cudaMemcpyHostToDevice, stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
}

std::vector<double> readOutput(const void* dev, std::size_t count, bool f32, cudaStream_t stream) {
  std::vector<double> out(count);
  if (f32) {
    std::vector<float> h(count);
    MK_CUDA_CHECK(cudaMemcpyAsync(h.data(), dev, count * 4, cudaMemcpyDeviceToHost, stream));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (std::size_t i = 0; i < count; ++i) out[i] = h[i];
  } else {
    std::vector<uint16_t> h(count);
    MK_CUDA_CHECK(cudaMemcpyAsync(h.data(), dev, count * 2, cudaMemcpyDeviceToHost, stream));
    MK_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (std::size_t i = 0; i < count; ++i) out[i] = bf16ToFloat(h[i]);
  }
  return out;
}

/// Median per-launch microseconds of `launch` over `reps` loops of `iters`.
template <class Launch>
double timeUs(const GemmArgs& a, cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop, Launch&& launch) {
  for (uint64_t i = 0; i < a.warmup; ++i) launch();
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> samples;
  for (uint64_t r = 0; r < a.reps; ++r) {
    MK_CUDA_CHECK(cudaEventRecord(start, stream));
    for (uint64_t i = 0; i < a.iters; ++i) launch();
    MK_CUDA_CHECK(cudaEventRecord(stop, stream));
    MK_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    MK_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    samples.push_back(static_cast<double>(ms) * 1000.0 / static_cast<double>(a.iters));
  }
  return median(samples);
}

struct Result {
  double oursUs = 0, cublasUs = 0, err = -1, bound = 0;
  bool checked = false, ok = true;
  uint32_t ctas = 0;
  uint64_t tileN = 0;
  mk::GemmEpilogue epilogue = mk::GemmEpilogue::Direct;  ///< the epilogue that ran (fp32 output: always direct)
  uint64_t splitK = 1;                                   ///< k-pieces per tile that ran
  mk::GemmSchedule schedule = mk::GemmSchedule::Tiles;   ///< the schedule that ran (the resident engine: tiles)
  uint64_t streamKTiles = 0;                             ///< tiles run as stream-K k-ranges
  std::string engine = "standalone";  ///< "standalone" (GemmPlan) or "resident" (a Gemm step, compute lanes)
  double stepUs = 0;  ///< resident: the last op's first step -> local done on the GPU clock (no per-op overhead)
};

/// Relative Frobenius error of `got` against `want` over m x n inside ldc; NaN/Inf fails.
void compare(const GemmArgs& a, const mk::GemmProblem& pr, const void* got, const void* want, std::size_t countC,
             cudaStream_t stream, Result& r) {
  const bool f32 = a.out == "f32";
  r.checked = true;
  const std::vector<double> g = readOutput(got, countC, f32, stream);
  const std::vector<double> w = readOutput(want, countC, f32, stream);
  double diff2 = 0, ref2 = 0;
  bool finite = true;
  for (int64_t row = 0; row < pr.m; ++row)
    for (int64_t col = 0; col < pr.n; ++col) {
      const auto i = static_cast<std::size_t>(row * pr.ldc + col);
      if (!std::isfinite(g[i])) finite = false;
      diff2 += (g[i] - w[i]) * (g[i] - w[i]);
      ref2 += w[i] * w[i];
    }
  r.err = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  r.bound = (f32 ? 0.0 : std::ldexp(1.0, -8)) + 2.0 * static_cast<double>(pr.k) * std::ldexp(1.0, -24);
  r.ok = finite && std::isfinite(r.err) && r.err <= r.bound;
  if (!finite) r.err = NAN;
}

/// The GEMM as a schedule of one rank: buffer ab (Input: A, then B at pr.b - pr.a), c (Output), one compute
/// lane with one Gemm step.
mk::Schedule gemmSchedule(const mk::GemmProblem& pr, uint64_t countA, uint64_t countB, std::size_t countC) {
  mk::Schedule s;
  s.nRanks = 1;
  s.nodeOf = {0};
  mk::BufferDecl ab, c;
  ab.name = "ab";
  ab.dtype = mk::DType::BFloat16;
  ab.kind = mk::BufferKind::Input;
  ab.count = {countA + countB};
  c.name = "c";
  c.dtype = pr.outDType;
  c.kind = mk::BufferKind::Output;
  c.count = {countC};
  s.buffers = {ab, c};
  mk::GemmShape g;
  g.m = static_cast<uint32_t>(pr.m);
  g.n = static_cast<uint32_t>(pr.n);
  g.k = static_cast<uint32_t>(pr.k);
  g.lda = static_cast<uint32_t>(pr.lda);
  g.ldb = static_cast<uint32_t>(pr.ldb);
  g.ldc = static_cast<uint32_t>(pr.ldc);
  s.gemms = {g};
  mk::Step st;
  st.kind = mk::StepKind::Gemm;
  st.flags = pr.layoutB == mk::GemmLayout::ColMajor ? mk::kStepBColMajor : 0;
  st.dst.buffer = 1;
  st.a.buffer = 0;
  st.b.buffer = 0;
  st.b.offset = countA;
  mk::Lane lane;
  lane.role = mk::LaneRole::Compute;
  lane.steps = {st};
  s.lanes = {{lane}};
  s.info.op = "gemm";
  s.info.algo = "compute-lane";
  mk::fillCostAttributes(s);
  return s;
}

/// The same GEMM through the resident kernel's compute lanes (see the file comment). `sms`: the GPU's SMs.
Result runResident(const GemmArgs& a, const Shape& sh, const mk::GemmProblem& pr, uint64_t countA, uint64_t countB,
                   std::size_t countC, void* cRes, const void* cRef, int sms, cudaStream_t stream, cudaEvent_t ev0,
                   cudaEvent_t ev1) {
  Result r;
  r.engine = "resident";
  const mk::Schedule s = gemmSchedule(pr, countA, countB, countC);
  mk::CommConfig cfg;
  cfg.computeLanes = true;
  // The control block holds an SM of its own: at most SMs - 1 workers (--ctas 0 or SMs asks for all of them).
  cfg.workerCtas = static_cast<uint32_t>(std::min<int64_t>(sh.ctas > 0 ? sh.ctas : sms - 1, sms - 1));
  {
    // What the lowering gives the lane (the same call the communicator makes).
    mk::runtime::LowerOptions lo;
    lo.nWorkers = cfg.workerCtas;
    const mk::runtime::LoweredProgram prog = mk::runtime::lowerRank(s, 0, lo);
    const auto* g = reinterpret_cast<const mk::device::LoweredGemm*>(prog.image.data() + prog.header().gemmsOffset);
    r.ctas = g->ctas;
    r.tileN = g->blockN;
    r.epilogue = (g->flags & mk::device::kLgTmaStore) ? mk::GemmEpilogue::TmaStore : mk::GemmEpilogue::Direct;
  }
  MK_CUDA_CHECK(cudaMemsetAsync(cRes, 0xFF, countC * (a.out == "f32" ? 4 : 2), stream));
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  auto comms = mk::Communicator::createLocal({0}, cfg);
  auto loop = [&](uint64_t n) {
    mk::groupStart();
    try {
      for (uint64_t i = 0; i < n; ++i) comms[0].execute(s, pr.a, cRes, stream);
    } catch (...) {
      mk::groupEnd();
      throw;
    }
    mk::groupEnd();
  };
  loop(a.warmup);
  MK_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> samples;
  for (uint64_t rep = 0; rep < a.reps; ++rep) {
    MK_CUDA_CHECK(cudaEventRecord(ev0, stream));
    loop(a.iters);
    MK_CUDA_CHECK(cudaEventRecord(ev1, stream));
    MK_CUDA_CHECK(cudaEventSynchronize(ev1));
    float ms = 0;
    MK_CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
    samples.push_back(static_cast<double>(ms) * 1000.0 / static_cast<double>(a.iters));
  }
  comms[0].synchronize();
  r.oursUs = median(samples);
  const mk::OpTiming t = comms[0].opTiming(comms[0].nextOpIndex() - 1);
  r.stepUs = static_cast<double>(t.localDoneNs - t.firstStepNs) / 1e3;
  if (a.check) compare(a, pr, cRes, cRef, countC, stream, r);
  return r;
}

/// Our standalone engine and cuBLASLt on one shape; with --engine resident / both, also the compute lane
/// (appended to `resident`).
Result runShape(const GemmArgs& a, const Shape& s, CublasLt& lt, cudaStream_t stream, cudaEvent_t ev0, cudaEvent_t ev1,
                uint64_t seed, int sms, std::vector<Result>& resident) {
  const bool f32 = a.out == "f32";
  const bool rowB = a.layoutB == "row";
  auto roundUp8 = [](int64_t v) { return (v + 7) / 8 * 8; };
  mk::GemmProblem pr;
  pr.m = s.m;
  pr.n = s.n;
  pr.k = s.k;
  pr.lda = roundUp8(s.k);
  pr.ldb = rowB ? roundUp8(s.n) : roundUp8(s.k);
  pr.layoutB = rowB ? mk::GemmLayout::RowMajor : mk::GemmLayout::ColMajor;
  pr.ldc = roundUp8(s.n);
  pr.outDType = f32 ? mk::DType::Float32 : mk::DType::BFloat16;
  const auto countA = static_cast<std::size_t>(pr.m * pr.lda);
  const auto countB = static_cast<std::size_t>(rowB ? pr.k * pr.ldb : pr.n * pr.ldb);
  const auto countC = static_cast<std::size_t>(pr.m * pr.ldc);
  const std::size_t outBytes = f32 ? 4 : 2;
  // A and B in one allocation (B 16-byte aligned after A: lda is a multiple of 8): the compute-lane run binds
  // them as one schedule buffer.
  DeviceBuffer bufAB((countA + countB) * 2), bufC(countC * outBytes), bufRef(countC * outBytes);
  const bool wantResident = a.engine != "standalone";
  DeviceBuffer bufRes(wantResident ? countC * outBytes : 16);
  fillRandom(bufAB.p, countA, seed * 2 + 1, stream);
  fillRandom(static_cast<uint16_t*>(bufAB.p) + countA, countB, seed * 2 + 2, stream);
  MK_CUDA_CHECK(cudaMemsetAsync(bufC.p, 0xFF, countC * outBytes, stream));  // NaN until written
  pr.a = bufAB.p;
  pr.b = static_cast<uint16_t*>(bufAB.p) + countA;

  Result r;
  mk::GemmConfig cfg;
  cfg.ctas = s.ctas;
  cfg.groupM = a.groupM;
  cfg.tileN = a.tileN;
  cfg.epilogue = a.epilogue == "tma-store" ? mk::GemmEpilogue::TmaStore : mk::GemmEpilogue::Direct;
  cfg.splitK = a.splitK;
  cfg.schedule = a.schedule == "stream-k" ? mk::GemmSchedule::StreamK
                 : a.schedule == "tiles"  ? mk::GemmSchedule::Tiles
                                          : mk::GemmSchedule::Auto;
  pr.c = bufC.p;
  mk::GemmPlan ours(pr, cfg);
  r.ctas = ours.ctas();
  r.tileN = ours.tiles().blockN;
  r.epilogue = ours.tiles().epilogue;
  r.splitK = ours.tiles().splitK;
  r.schedule = ours.tiles().schedule;
  r.streamKTiles = ours.tiles().streamKTiles;
  r.oursUs = timeUs(a, stream, ev0, ev1, [&] { ours.run(stream); });

  mk::GemmProblem ref = pr;
  ref.c = bufRef.p;
  CublasLt::Plan theirs = lt.plan(ref);
  r.cublasUs = timeUs(a, stream, ev0, ev1, [&] { lt.run(theirs, stream); });

  if (a.check) compare(a, pr, bufC.p, bufRef.p, countC, stream, r);
  if (wantResident) {
    Result res = runResident(a, s, pr, countA, countB, countC, bufRes.p, bufRef.p, sms, stream, ev0, ev1);
    res.cublasUs = r.cublasUs;
    resident.push_back(res);
  }
  if (a.engine == "resident") r.engine = "-";  // timed, but the row asked for is the resident one
  return r;
}

}  // namespace

int gemmMain(int argc, char** argv, const std::string& command) {
  GemmArgs a;
  CLI::App app{"mk-bench gemm: the Hopper GEMM engine (wgmma + TMA, persistent CTAs) against cuBLASLt, on GPU 0",
               "mk-bench gemm"};
  app.add_option("-m", a.m, "rows of A and C");
  app.add_option("-n", a.n, "columns of B and C");
  app.add_option("-k", a.k, "columns of A, rows of B");
  app.add_option("--ctas", a.ctas, "CTAs of our persistent grid (0 = every SM; cuBLAS always uses every SM)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--layout-b", a.layoutB, "B storage: row (K x N row-major) or col (N x K row-major, 'TN')")
      ->check(CLI::IsMember({"row", "col"}));
  app.add_option("--out", a.out, "C element type: bf16 or f32")->check(CLI::IsMember({"bf16", "f32"}));
  app.add_flag("--check", a.check,
               "compare with cuBLASLt: relative Frobenius error <= u_out + 2 K 2^-24 (u_out 2^-8 for bf16, 0 for f32), "
               "no NaN/Inf; exit 1 otherwise");
  app.add_option("--json", a.json, "write measurement records (mkernel.measurement.v1) to this file, atomically");
  app.add_option("--iters", a.iters, "launches per timed loop")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup", a.warmup, "untimed launches before timing");
  app.add_option("--reps", a.reps, "timed loops; the median is reported")->check(CLI::PositiveNumber);
  app.add_option("--group-m", a.groupM, "tile rows per raster group of our engine (L2 reuse)")
      ->check(CLI::PositiveNumber);
  app.add_option("--tile-n", a.tileN, "our output tile width: 128, 256, or 0 = chosen per shape (wave count model)")
      ->check(CLI::IsMember({0, 128, 256}));
  app.add_option(
         "--epilogue", a.epilogue,
         "our epilogue: tma-store (the default: shared-memory staging + TMA stores overlapping the next tile; "
         "bf16 output with N a multiple of 8, else direct) or direct (registers to global). The 'epi' column and the "
         "JSON field 'epilogue' say which ran")
      ->check(CLI::IsMember({"direct", "tma-store"}));
  app.add_option("--split-k", a.splitK,
                 "split each tile's k-range over this many CTAs (fp32 partials summed by the last one; 1 = off, "
                 "at most 64, reduced so no piece is empty: the 'sk' column and JSON 'split_k' say what ran)")
      ->check(CLI::Range(1, 64));
  app.add_option(
         "--schedule", a.schedule,
         "how our tiles are spread over the CTAs: auto (the default: stream-K where the wave model predicts a "
         "gain and every CTA gets >= half a tile of k-work), tiles (whole tiles, CTA c runs c, c + ctas, ...) or "
         "stream-k (whole waves, then the remaining tiles as equal k-iteration ranges per CTA; not with "
         "--split-k > 1). The 'sched' column and JSON extra.schedule say which ran")
      ->check(CLI::IsMember({"auto", "tiles", "stream-k"}));
  app.add_option("--shapes", a.shapes,
                 "preset instead of -m/-n/-k/--ctas: reference = b x b x b/2 (b = 2048..16384), M x 8192 x 14336 "
                 "(M = 1024, 4096, 16384), M x 8192 x 8192 (M = 128, 512), each with every SM and with 116 CTAs")
      ->check(CLI::IsMember({"reference", "issue6"}));
  app.add_option("--engine", a.engine,
                 "standalone (GemmPlan, its own kernel), resident (the same GEMM as a Gemm step of a 1-GPU "
                 "communicator with compute lanes: the resident kernel's in-kernel rate, per-op engine cost included) "
                 "or both; the 'engine' column and JSON extra.engine say which")
      ->check(CLI::IsMember({"standalone", "resident", "both"}));
  if (int rc = mk::cli::parse(app, argc, argv, "mk-bench gemm"); rc != mk::cli::kContinue) return rc;

  std::vector<Shape> shapes;
  if (a.shapes == "issue6") {  // the table's old name, refused with the new one
    std::fprintf(stderr, "mk-bench gemm: --shapes issue6 is now --shapes reference (the same table); use that\n");
    return 2;
  }
  if (a.shapes == "reference") {
    shapes = referenceShapes();
  } else {
    if (a.m <= 0 || a.n <= 0 || a.k <= 0) {
      std::fprintf(stderr,
                   "mk-bench gemm: -m, -n and -k must all be >= 1 (got %lld %lld %lld), or use --shapes reference\n",
                   static_cast<long long>(a.m), static_cast<long long>(a.n), static_cast<long long>(a.k));
      return 2;
    }
    shapes.push_back({a.m, a.n, a.k, a.ctas});
  }

  try {
    MK_CUDA_CHECK(cudaSetDevice(0));
    int sms = 0;
    MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CublasLt lt;
    cudaStream_t stream = nullptr;
    cudaEvent_t ev0 = nullptr, ev1 = nullptr;
    MK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    MK_CUDA_CHECK(cudaEventCreate(&ev0));
    MK_CUDA_CHECK(cudaEventCreate(&ev1));
    std::printf("# mk-bench gemm: GPU 0 (%d SMs), cuBLASLt %s (%s), B %s-major, C %s, iters %llu, reps %llu\n", sms,
                lt.version().c_str(), lt.path().c_str(), a.layoutB.c_str(), a.out.c_str(),
                static_cast<unsigned long long>(a.iters), static_cast<unsigned long long>(a.reps));
    std::printf("# vs_share = ours / (cublas x ctas / SMs): the 116-CTA target is >= 0.85, all SMs >= 0.90\n");
    std::printf("%10s %7s %7s %7s %5s %4s %3s %8s %9s %6s %5s %10s %10s %12s %14s %7s %9s %10s %10s %6s\n", "engine",
                "m", "n", "k", "ctas", "tile", "sk", "sched", "epi", "layout", "out", "ours_us", "cublas_us",
                "ours_TFLOPs", "cublas_TFLOPs", "ratio", "vs_share", "rel_err", "bound", "check");
    mk::MeasurementFile file = newMeasurementFile(1, "", command);
    file.system["cublaslt"] = mkbench::quoted(lt.version());
    bool allOk = true;
    uint64_t seed = std::random_device{}();
    for (const Shape& s : shapes) {
      std::vector<Result> rows;
      const Result first = runShape(a, s, lt, stream, ev0, ev1, ++seed, sms, rows);
      if (first.engine != "-") rows.insert(rows.begin(), first);
      for (const Result& r : rows) {
        const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
        const double ours = flops / r.oursUs * 1e-6, theirs = flops / r.cublasUs * 1e-6;
        const double share = theirs * static_cast<double>(r.ctas) / static_cast<double>(sms);
        const bool f32 = a.out == "f32";
        std::string errText = "-", boundText = "-";
        if (r.checked) {
          errText = mk::strprintf("%.3g", r.err);
          boundText = mk::strprintf("%.3g", r.bound);
        }
        std::printf(
            "%10s %7lld %7lld %7lld %5u %4llu %3llu %8s %9s %6s %5s %10.2f %10.2f %12.1f %14.1f %7.3f %9.3f %10s %10s "
            "%6s\n",
            r.engine.c_str(), static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
            r.ctas, static_cast<unsigned long long>(r.tileN), static_cast<unsigned long long>(r.splitK),
            mk::toString(r.schedule), mk::toString(r.epilogue), a.layoutB.c_str(), a.out.c_str(), r.oursUs, r.cublasUs,
            ours, theirs, ours / theirs, ours / share, errText.c_str(), boundText.c_str(),
            r.checked ? (r.ok ? "ok" : "FAIL") : "-");
        std::fflush(stdout);
        if (r.engine == "resident")
          std::printf(
              "# resident: the last op's Gemm step took %.2f us on the GPU clock (first step -> local done) = "
              "%.1f TFLOP/s; the rest of %.2f us per op is the engine's per-op cost\n",
              r.stepUs, flops / r.stepUs * 1e-6, r.oursUs);
        allOk = allOk && r.ok;
        const auto bytes = static_cast<uint64_t>((s.m * s.k + s.k * s.n) * 2 + s.m * s.n * (f32 ? 4 : 2));
        for (int which = 0; which < 2; ++which) {
          if (which == 1 && r.engine == "resident" && a.engine == "both") continue;  // cuBLAS recorded once
          mk::MeasurementRecord rec;
          rec.op = "gemm";
          rec.impl = which == 0 ? "mkernel" : "cublas";
          rec.algo = which == 0 ? (r.engine == "resident" ? "wgmma-tma-compute-lane" : "wgmma-tma-persistent")
                                : "cublaslt-heuristic";
          rec.dtype = "bfloat16";
          rec.ranks = 1;
          rec.bytes = bytes;
          rec.timeUs = which == 0 ? r.oursUs : r.cublasUs;
          rec.algbwGBs = static_cast<double>(bytes) / rec.timeUs * 1e-3;
          rec.iters = a.iters;
          rec.stat = "median";
          rec.extra["m"] = std::to_string(s.m);
          rec.extra["n"] = std::to_string(s.n);
          rec.extra["k"] = std::to_string(s.k);
          rec.extra["ctas"] = std::to_string(which == 0 ? r.ctas : static_cast<uint32_t>(sms));
          rec.extra["layout"] = mkbench::quoted(a.layoutB);
          rec.extra["out_dtype"] = mkbench::quoted(f32 ? "float32" : "bfloat16");
          if (which == 0) {
            rec.extra["engine"] = mkbench::quoted(r.engine);
            rec.extra["tile"] = mkbench::quoted("128x" + std::to_string(r.tileN));
            rec.extra["epilogue"] = mkbench::quoted(mk::toString(r.epilogue));
            rec.extra["split_k"] = std::to_string(r.splitK);
            rec.extra["schedule"] = mkbench::quoted(mk::toString(r.schedule));
            rec.extra["stream_k_tiles"] = std::to_string(r.streamKTiles);
          }
          rec.extra["flops"] = std::to_string(static_cast<uint64_t>(flops));
          rec.extra["tflops"] = mk::strprintf("%.3f", which == 0 ? ours : theirs);
          if (which == 0 && r.engine == "resident") rec.extra["step_us"] = mk::strprintf("%.3f", r.stepUs);
          if (which == 0 && r.checked) {
            rec.extra["rel_err"] = mk::strprintf("%.6g", std::isfinite(r.err) ? r.err : -1.0);
            rec.extra["check"] = r.ok ? "true" : "false";
          }
          file.records.push_back(rec);
        }
      }
    }
    cudaEventDestroy(ev0);
    cudaEventDestroy(ev1);
    cudaStreamDestroy(stream);
    if (!a.json.empty()) mk::saveMeasurementFile(file, a.json);
    if (!allOk) {
      std::fprintf(stderr, "mk-bench gemm: check FAILED (relative error above its bound, or NaN/Inf)\n");
      return 1;
    }
    return 0;
  } catch (const mk::Error& e) {  // no GPU 3, driver too old 4, the rest 2 (mk/util/cli.hpp)
    std::fprintf(stderr, "mk-bench gemm: %s\n", e.what());
    return mk::cli::exitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mk-bench gemm: %s\n", e.what());
    return 2;
  }
}

}  // namespace mkbench

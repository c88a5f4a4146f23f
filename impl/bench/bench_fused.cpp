// mk-bench gemm-rs | ag-gemm | gemm-ar — the fused operators (docs/fused-operators.md) against the unfused program,
// nccl-tests style, on the GPUs of this machine.
//
//   mk-bench gemm-rs [-b 2048] [-e 16384] [-f 2] [-m M -n N -k K] [--ranks R] [--layout-b row|col] [--tile-rows T]
//                    [--order auto|own-first|own-last|interleaved] [--comm-ctas C] [--compute-lanes L]
//                    [--iters I] [-w W] [--reps R] [--check] [--samples S] [--json f] [--trace f]
//
// Shapes: M = N = b, K = b / 2 for b = -b, -b * -f, ... <= -e (the public mKernel benchmark's), or one -m -n -k.
// Ranks: R ranks on the visible GPUs in turn; more ranks than GPUs share them (CommConfig::shareGpus, each rank's
// resident kernel holding its share of the SMs).
//
// Columns, per shape (medians over --reps loops of --iters back-to-back ops, CUDA events, nccl-tests style):
//  * fused_us: the fused op through Communicator (one op per rank per iteration, one group per loop);
//  * gemm_us: each rank's GEMM by cuBLASLt, one after another on one stream, with no communicator alive (every SM);
//  * coll_us: the collective alone: NCCL's when every rank has a GPU of its own; NCCL refuses two ranks on one GPU
//    ("duplicate GPU"), so when ranks share a GPU it is mkernel's own collective (auto algorithm, communication-only
//    kernel), labelled "mkernel"; on one rank there is none;
//  * base_us: the unfused program. With a GPU per rank, cuBLASLt GEMM and NCCL collective run one after the other on
//    each rank's stream (all-gather first for ag-gemm), timed as such (fused_baseline.hpp); with shared GPUs, the
//    parts timed alone and summed (a lower bound on running them one after the other). bound_us = max(gemm_us,
//    coll_us): the physical bound of any overlap; speedup = base_us / fused_us; TFLOP/s = 2 m n k / fused_us.
// --check: every rank's C against the exact product under mk::verifyFused's tolerance, at --samples random elements
// per rank (0 = all). --trace: the last shape's last fused op as Chrome trace JSON.
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "cublaslt_loader.hpp"
#include "fused_baseline.hpp"
#include "fused_check.hpp"
#include "lowering/lowering.hpp"
#include "mk/communicator.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device_info.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/io/output_paths.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/format.hpp"
#include "mk/util/size.hpp"

namespace mkbench {
namespace {

struct FusedArgs {
  std::string op;
  std::string minB = "2048", maxB = "16384";
  uint64_t factor = 2;
  int64_t m = 0, n = 0, k = 0;
  uint32_t ranks = 1;
  std::string layoutB = "row", order = "auto", json, trace;
  std::string tileRows = "0", commCtas = "0";  ///< comma lists: every combination runs against one baseline
  uint32_t computeLanes = 0;
  uint64_t iters = 20, warmup = 5, reps = 5, samples = 4096;
  bool check = false;
};

/// cudaMalloc'd memory, freed at scope exit (allocated before any communicator exists).
struct Dev {
  void* p = nullptr;
  explicit Dev(uint64_t bytes) { MK_CUDA_CHECK(cudaMalloc(&p, std::max<uint64_t>(bytes, 16))); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  char* get() const { return static_cast<char*>(p); }
};

/// Median of `reps` loops of `iters` calls of `body` (one group per loop), timed on every stream.
template <class Body>
double timeGroupedUs(const FusedArgs& a, Streams& st, Body&& body) {
  auto loop = [&](uint64_t n) {
    mk::groupStart();
    try {
      for (uint64_t i = 0; i < n; ++i) body();
    } catch (...) {
      mk::groupEnd();
      throw;
    }
    mk::groupEnd();
  };
  loop(a.warmup);
  st.sync();
  std::vector<double> samples;
  for (uint64_t r = 0; r < a.reps; ++r) {
    st.recordStart();
    loop(a.iters);
    samples.push_back(st.recordStopAndElapsedMs() * 1e3 / static_cast<double>(a.iters));
  }
  return median(samples);
}

struct Shape {
  uint64_t m, n, k;
};

/// One fused variant (options) of a shape.
struct Variant {
  mk::FusedOptions opt;  ///< as asked
  mk::FusedPlan plan;    ///< as run
  uint32_t workers = 0, computeCtas = 0, commCtas = 0;
  double fusedUs = 0;
  bool checked = false, ok = true;
  double worst = 0;
  std::string first;
};

/// "0,512,1024" -> {0, 512, 1024}.
std::vector<uint32_t> parseList(const std::string& text, const char* what) {
  std::vector<uint32_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos)
      throw mk::Error(mk::ErrorCode::InvalidArgument,
                      std::string(what) + ": '" + text + "' is not a comma list of numbers");
    out.push_back(static_cast<uint32_t>(std::stoul(item)));
  }
  if (out.empty()) throw mk::Error(mk::ErrorCode::InvalidArgument, std::string(what) + " is empty");
  return out;
}

int runFused(const FusedArgs& a, const std::string& command) {
  const mk::FusedOp op = mk::requireFusedOp(a.op);
  std::vector<Shape> shapes;
  if (a.m || a.n || a.k) {
    if (a.m <= 0 || a.n <= 0 || a.k <= 0)
      throw mk::Error(mk::ErrorCode::InvalidArgument, "-m, -n and -k go together, each >= 1");
    shapes.push_back({uint64_t(a.m), uint64_t(a.n), uint64_t(a.k)});
  } else {
    const uint64_t lo = mk::parseSize(a.minB), hi = mk::parseSize(a.maxB);
    if (lo < 2 || hi < lo) throw mk::Error(mk::ErrorCode::InvalidArgument, "need 2 <= -b <= -e");
    if (a.factor < 2) throw mk::Error(mk::ErrorCode::InvalidArgument, "-f must be >= 2");
    for (uint64_t b = lo; b <= hi; b *= a.factor) {
      shapes.push_back({b, b, b / 2});
      if (b > hi / a.factor) break;
    }
  }
  const auto order = mk::parseTileOrder(a.order);
  if (!order) throw mk::Error(mk::ErrorCode::InvalidArgument, "unknown --order '" + a.order + "'");
  const auto layoutB = mk::parseMatrixLayout(a.layoutB);
  if (!layoutB) throw mk::Error(mk::ErrorCode::InvalidArgument, "unknown --layout-b '" + a.layoutB + "'");
  std::vector<mk::FusedOptions> variants;
  for (uint32_t tile : parseList(a.tileRows, "--tile-rows"))
    for (uint32_t comm : parseList(a.commCtas, "--comm-ctas")) {
      mk::FusedOptions opt;
      opt.tileRows = tile;
      opt.order = *order;
      opt.commCtas = comm;
      opt.computeLanes = a.computeLanes;
      variants.push_back(opt);
    }
  // Every shape is checked before any GPU work (bad input: one line, exit 2, nothing written).
  for (const Shape& s : shapes)
    mk::validateFusedSpec(mk::FusedSpec{op, mk::DType::BFloat16, s.m, s.n, s.k, *layoutB}, a.ranks);

  const int available = mk::requireCudaDevices();
  std::vector<int> devs;
  for (uint32_t r = 0; r < a.ranks; ++r) devs.push_back(static_cast<int>(r % static_cast<uint32_t>(available)));
  const bool shared = a.ranks > static_cast<uint32_t>(available);
  const int gpus = std::min<int>(available, static_cast<int>(a.ranks));
  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  MK_CUDA_CHECK(cudaSetDevice(0));
  CublasLt lt;
  std::printf("# mk-bench %s: %u rank(s) on %d x %s (%d SMs)%s, bf16, B %s-major, iters %llu, warmup %llu, reps %llu\n",
              a.op.c_str(), a.ranks, gpus, prop.name, prop.multiProcessorCount,
              shared ? ", ranks SHARE the GPU (not the multi-GPU targets)" : "", a.layoutB.c_str(),
              static_cast<unsigned long long>(a.iters), static_cast<unsigned long long>(a.warmup),
              static_cast<unsigned long long>(a.reps));
  const bool ncclBase = a.ranks > 1 && !shared;  // a GPU per rank: the unfused program runs on NCCL
  if (ncclBase)
    std::printf(
        "# baseline: cuBLASLt %s GEMM and NCCL collective one after the other on each rank's stream (base); "
        "each alone (gemm, coll); bound = max\n",
        lt.version().c_str());
  else
    std::printf(
        "# baseline: cuBLASLt %s GEMM%s, parts timed alone in this run and summed (base = gemm + coll; bound = "
        "max)\n",
        lt.version().c_str(),
        a.ranks == 1 ? " (one rank: no collective)"
                     : " + mkernel's own collective (communication-only kernel; NCCL refuses two ranks on one "
                       "GPU)");
  std::printf("%8s %5s %6s %6s %6s %5s %11s %5s %6s %10s %10s %10s %10s %10s %8s %9s %9s %7s\n", "op", "ranks", "m",
              "n", "k", "tile", "order", "lanes", "cmp/cm", "fused_us", "base_us", "gemm_us", "coll_us", "bound_us",
              "speedup", "vs_bound", "TFLOP/s", "check");
  mk::MeasurementFile file = newMeasurementFile(gpus, "", command);
  file.system["cublaslt"] = quoted(lt.version());
  if (shared) file.system["ranks_share_gpu"] = "true";
  bool allOk = true;
  uint64_t seed = std::random_device{}();
  for (size_t si = 0; si < shapes.size(); ++si) {
    const Shape& sh = shapes[si];
    const mk::FusedSpec spec{op, mk::DType::BFloat16, sh.m, sh.n, sh.k, *layoutB};
    const FusedHostData d = makeFusedInputs(spec, a.ranks, ++seed);
    const bool ag = op == mk::FusedOp::AllGatherGemm, ar = op == mk::FusedOp::GemmAllReduce;
    // ---- buffers, before any communicator: a, b, c per rank; the baseline's GEMM output (rs / ar: the m x n partial;
    // ag: C) and collective output (rs / ar: C; ag: the gathered m x k A).
    std::vector<std::unique_ptr<Dev>> A, B, C, gemmOut, collOut;
    for (uint32_t r = 0; r < a.ranks; ++r) {
      MK_CUDA_CHECK(cudaSetDevice(devs[r]));
      A.push_back(std::make_unique<Dev>(d.a[r].size() * 2));
      B.push_back(std::make_unique<Dev>(d.b[r].size() * 2));
      C.push_back(std::make_unique<Dev>(fusedOutputCount(d, r) * 2));
      gemmOut.push_back(std::make_unique<Dev>((ag ? fusedOutputCount(d, r) : sh.m * sh.n) * 2));
      collOut.push_back(std::make_unique<Dev>((ag ? sh.m * sh.k : fusedOutputCount(d, r)) * 2));
      MK_CUDA_CHECK(cudaMemcpy(A[r]->p, d.a[r].data(), d.a[r].size() * 2, cudaMemcpyHostToDevice));
      MK_CUDA_CHECK(cudaMemcpy(B[r]->p, d.b[r].data(), d.b[r].size() * 2, cudaMemcpyHostToDevice));
      MK_CUDA_CHECK(cudaMemset(C[r]->p, 0xFF, fusedOutputCount(d, r) * 2));  // NaN until written
    }
    Streams st(devs);
    std::vector<Variant> rows;
    // ---- the fused op, every variant on one communicator
    {
      mk::CommConfig cfg;
      cfg.computeLanes = true;
      cfg.shareGpus = shared;
      cfg.trace = !a.trace.empty() && si + 1 == shapes.size();
      auto comms = mk::Communicator::createLocal(devs, cfg);
      for (const mk::FusedOptions& opt : variants) {
        Variant row;
        row.opt = opt;
        row.plan = comms[0].fusedPlan(spec, opt);
        row.workers = comms[0].workerCtas();
        // The split the lowering gives rank 0's lanes (what ran, not only what the plan weighs).
        const mk::Schedule s = mk::generate(spec, std::vector<uint32_t>(a.ranks, 0), row.plan.opt);
        mk::runtime::LowerOptions lo;
        lo.nWorkers = row.workers;
        const mk::runtime::LoweredProgram prog = mk::runtime::lowerRank(s, 0, lo);
        for (uint32_t l = 0; l < prog.nLanes; ++l)
          (s.lanes[0][l].role == mk::LaneRole::Compute ? row.computeCtas : row.commCtas) += prog.lanes()[l].ctaCount;
        for (uint32_t r = 0; r < a.ranks; ++r)  // NaN until written
          MK_CUDA_CHECK(cudaMemsetAsync(C[r]->p, 0xFF, fusedOutputCount(d, r) * 2, st.s[r]));
        st.sync();
        row.fusedUs = timeGroupedUs(a, st, [&] {
          for (uint32_t r = 0; r < a.ranks; ++r) comms[r].fused(spec, A[r]->p, B[r]->p, C[r]->p, st.s[r], opt);
        });
        for (auto& c : comms) c.synchronize();
        if (a.check) {
          row.checked = true;
          for (uint32_t r = 0; r < a.ranks; ++r) {
            std::vector<uint16_t> c(fusedOutputCount(d, r));
            MK_CUDA_CHECK(cudaMemcpyAsync(c.data(), C[r]->p, c.size() * 2, cudaMemcpyDeviceToHost, st.s[r]));
            MK_CUDA_CHECK(cudaStreamSynchronize(st.s[r]));
            const FusedCheck chk = checkFusedOutput(d, r, c.data(), a.samples, seed + r);
            row.worst = std::max(row.worst, chk.worstRatio);
            if (!chk.ok() && row.ok) row.first = chk.first;
            row.ok = row.ok && chk.ok();
          }
        }
        rows.push_back(row);
      }
      if (cfg.trace) {
        const uint64_t last = comms[0].nextOpIndex() - 1;
        std::vector<mk::TraceEvent> ev;
        for (auto& c : comms)
          for (const mk::TraceEvent& e : c.takeTrace())
            if (e.op == last) ev.push_back(e);
        std::ofstream(a.trace) << mk::traceToChromeJson(ev, "mkernel " + a.op);
        std::printf("# trace of the last op (%zu steps) written to %s\n", ev.size(), a.trace.c_str());
      }
    }
    double gemmUs = 0, collUs = 0, seqUs = 0;
    std::string collName;
    const bool evenRows = sh.m % a.ranks == 0;
    const uint64_t shardRows = sh.m / a.ranks;
    // Every rank's GEMM of the unfused program: its shard of the problem, into gemmOut (ag: from the gathered A).
    auto gemmOf = [&](uint32_t r) {
      const mk::FusedShard& fs = d.shards[r];
      mk::GemmProblem pr;
      pr.m = static_cast<int64_t>(sh.m);
      pr.n = static_cast<int64_t>(fs.cols);
      pr.k = static_cast<int64_t>(fs.kLen);
      pr.lda = pr.k;
      pr.layoutB = *layoutB == mk::MatrixLayout::ColMajor ? mk::GemmLayout::ColMajor : mk::GemmLayout::RowMajor;
      pr.ldb = pr.layoutB == mk::GemmLayout::ColMajor ? pr.k : pr.n;
      pr.ldc = pr.n;
      pr.outDType = mk::DType::BFloat16;
      pr.a = ag ? collOut[r]->p : A[r]->p;  // ag: the gathered A (whatever it holds: timing only)
      pr.b = B[r]->p;
      pr.c = gemmOut[r]->p;
      return pr;
    };
    if (ncclBase && evenRows) {
      // ---- baseline on NCCL: a GPU per rank, no communicator alive
      std::vector<mk::GemmProblem> gemms;
      BaselineCollective bc;
      bc.op = ag ? mk::CollOp::AllGather : ar ? mk::CollOp::AllReduce : mk::CollOp::ReduceScatter;
      bc.first = ag;
      bc.count = ag ? shardRows * sh.k : ar ? sh.m * sh.n : shardRows * sh.n;
      for (uint32_t r = 0; r < a.ranks; ++r) {
        gemms.push_back(gemmOf(r));
        bc.send.push_back(ag ? A[r]->p : gemmOut[r]->p);
        bc.recv.push_back(collOut[r]->p);
      }
      const NcclBaseline nb = timeCublasThenNccl(devs, st, gemms, bc, BaselineTiming{a.iters, a.warmup, a.reps});
      gemmUs = nb.gemmUs;
      collUs = nb.collUs;
      seqUs = nb.sequentialUs;
      collName = std::string("nccl ") + nb.ncclVersion + " " + mk::toString(bc.op);
      file.system["nccl"] = quoted(nb.ncclVersion);
    } else {
      // ---- baseline: each rank's GEMM by cuBLASLt (no communicator alive), then the collective alone
      {
        std::vector<CublasLt::Plan> plans;
        for (uint32_t r = 0; r < a.ranks; ++r) plans.push_back(lt.plan(gemmOf(r)));
        Streams one({0});
        gemmUs = timeGroupedUs(a, one, [&] {
          for (uint32_t r = 0; r < a.ranks; ++r) lt.run(plans[r], one.s[0]);
        });
      }
      if (a.ranks > 1 && evenRows) {
        mk::CommConfig cfg;
        cfg.shareGpus = shared;
        auto comms = mk::Communicator::createLocal(devs, cfg);
        collName = ag ? "allgather" : ar ? "allreduce" : "reducescatter";
        collUs = timeGroupedUs(a, st, [&] {
          for (uint32_t r = 0; r < a.ranks; ++r) {
            if (ag)
              comms[r].allGather(A[r]->p, collOut[r]->p, shardRows * sh.k, mk::DType::BFloat16, st.s[r]);
            else if (ar)
              comms[r].allReduce(gemmOut[r]->p, collOut[r]->p, sh.m * sh.n, mk::DType::BFloat16, mk::RedOp::Sum,
                                 st.s[r]);
            else
              comms[r].reduceScatter(gemmOut[r]->p, collOut[r]->p, shardRows * sh.n, mk::DType::BFloat16,
                                     mk::RedOp::Sum, st.s[r]);
          }
        });
        const mk::CollOp cop = ag ? mk::CollOp::AllGather : ar ? mk::CollOp::AllReduce : mk::CollOp::ReduceScatter;
        collName += std::string(" ") + mk::toString(comms[0].chooseAlgorithm(cop,
                                                                             ag   ? shardRows * sh.k
                                                                             : ar ? sh.m * sh.n
                                                                                  : shardRows * sh.n,
                                                                             mk::DType::BFloat16));
      }
      seqUs = gemmUs + collUs;  // the shared-GPU (or one-rank) baseline: the parts summed
    }
    // ---- report
    const double flops = mk::fusedFlops(spec);
    const bool haveBase = a.ranks == 1 || evenRows;
    const double base = seqUs, bound = std::max(gemmUs, collUs);
    // ---- records
    const uint64_t collBytes = (ag ? sh.m * sh.k : sh.m * sh.n) * 2;
    auto common = [&](mk::MeasurementRecord& rec) {
      rec.op = a.op;
      rec.dtype = "bfloat16";
      rec.ranks = a.ranks;
      rec.bytes = collBytes;
      rec.iters = a.iters;
      rec.stat = "median";
      rec.extra["m"] = std::to_string(sh.m);
      rec.extra["n"] = std::to_string(sh.n);
      rec.extra["k"] = std::to_string(sh.k);
      rec.extra["layout_b"] = quoted(a.layoutB);
      rec.extra["gpus"] = std::to_string(gpus);
      rec.extra["shared_gpu"] = shared ? "true" : "false";
      rec.extra["flops"] = std::to_string(static_cast<uint64_t>(flops));
    };
    auto num = [](double v) { return mk::strprintf("%.3f", v); };
    for (const Variant& row : rows) {
      std::string baseText = "-", collText = "-", speedText = "-", vsText = "-";
      if (haveBase) {
        baseText = mk::strprintf("%.2f", base);
        collText = mk::strprintf("%.2f", collUs);
        speedText = mk::strprintf("%.3f", base / row.fusedUs);
        vsText = mk::strprintf("%.3f", bound / row.fusedUs);
      }
      const std::string split = std::to_string(row.computeCtas) + "/" + std::to_string(row.commCtas);
      std::printf("%8s %5u %6llu %6llu %6llu %5u %11s %5u %6s %10.2f %10s %10.2f %10s %10.2f %8s %9s %9.1f %7s\n",
                  a.op.c_str(), a.ranks, static_cast<unsigned long long>(sh.m), static_cast<unsigned long long>(sh.n),
                  static_cast<unsigned long long>(sh.k), row.plan.opt.tileRows, mk::toString(row.plan.opt.order),
                  row.plan.opt.computeLanes, split.c_str(), row.fusedUs, baseText.c_str(), gemmUs, collText.c_str(),
                  haveBase ? bound : gemmUs, speedText.c_str(), vsText.c_str(), flops / row.fusedUs * 1e-6,
                  row.checked ? (row.ok ? "ok" : "FAIL") : "-");
      if (row.checked && !row.ok) std::printf("# check FAILED: %s\n", row.first.c_str());
      std::fflush(stdout);
      allOk = allOk && row.ok;
      mk::MeasurementRecord f;
      common(f);
      f.impl = "mkernel";
      f.algo = std::string("fused ") + mk::toString(row.plan.opt.order);
      f.timeUs = row.fusedUs;
      f.algbwGBs = static_cast<double>(collBytes) / row.fusedUs * 1e-3;
      f.extra["sms"] = std::to_string(row.workers * a.ranks);  // each compute-lane CTA owns an SM
      f.extra["ctas"] = std::to_string(row.workers);
      f.extra["compute_ctas"] = std::to_string(row.computeCtas);
      f.extra["comm_ctas"] = std::to_string(row.commCtas);
      f.extra["plan_comm_ctas"] = std::to_string(row.plan.opt.commCtas);
      f.extra["tile_rows"] = std::to_string(row.plan.opt.tileRows);
      f.extra["order"] = quoted(mk::toString(row.plan.opt.order));
      f.extra["compute_lanes"] = std::to_string(row.plan.opt.computeLanes);
      f.extra["predicted_us"] = num(row.plan.estimate.totalUs);
      f.extra["tflops"] = num(flops / row.fusedUs * 1e-6);
      if (haveBase) {
        f.extra["baseline_us"] = num(base);
        f.extra["bound_us"] = num(bound);
        f.extra["speedup"] = num(base / row.fusedUs);
      }
      if (row.checked) {
        f.extra["check"] = row.ok ? "true" : "false";
        f.extra["check_samples"] = std::to_string(a.samples);
        f.extra["worst_error_over_tolerance"] = num(row.worst);
      }
      file.records.push_back(f);
    }
    if (haveBase) {
      mk::MeasurementRecord b;
      common(b);
      b.impl = a.ranks == 1 ? "cublas" : ncclBase ? "cublas+nccl" : "cublas+mkernel";
      b.algo = a.ranks == 1 ? "cublaslt-heuristic" : "cublaslt then " + collName;
      b.timeUs = base;
      b.algbwGBs = static_cast<double>(collBytes) / base * 1e-3;
      b.extra["sms"] = std::to_string(prop.multiProcessorCount);
      b.extra["gemm_us"] = num(gemmUs);
      b.extra["coll_us"] = num(collUs);
      b.extra["baseline"] = quoted(ncclBase ? "GEMM and collective one after the other on each rank's stream, timed"
                                            : "parts timed alone in the same run and summed");
      b.extra["tflops"] = num(flops / base * 1e-6);
      file.records.push_back(b);
    }
  }
  if (!a.json.empty()) mk::saveMeasurementFile(file, a.json);
  if (!allOk) {
    std::fprintf(stderr, "mk-bench %s: check FAILED\n", a.op.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int fusedMain(int argc, char** argv, const std::string& command) {
  FusedArgs a;
  a.op = argv[0];
  CLI::App app{"mk-bench " + a.op + ": the fused operator against cuBLASLt GEMM + the collective, in the same run",
               "mk-bench " + a.op};
  app.add_option("-b,--minsize", a.minB, "smallest b (M = N = b, K = b / 2)");
  app.add_option("-e,--maxsize", a.maxB, "largest b");
  app.add_option("-f,--stepfactor", a.factor, "b multiplication factor");
  app.add_option("-m", a.m, "one shape instead of -b/-e: rows of A and C");
  app.add_option("-n", a.n, "columns of B and C");
  app.add_option("-k", a.k, "columns of A, rows of B");
  app.add_option("--ranks", a.ranks, "ranks (more than the visible GPUs: they share them)")->check(CLI::Range(1, 8));
  app.add_option("--layout-b", a.layoutB, "B storage: row or col")->check(CLI::IsMember({"row", "col"}));
  app.add_option("--tile-rows", a.tileRows, "rows of C per tile (0: the engine's default); a comma list runs each");
  app.add_option("--order", a.order, "auto | own-first | own-last | interleaved");
  app.add_option("--comm-ctas", a.commCtas,
                 "CTAs of the communication lanes (0: the model's split); a comma list runs each (with every tile)");
  app.add_option("--compute-lanes", a.computeLanes, "compute lanes (0: the model's choice)");
  app.add_option("--iters", a.iters, "ops per timed loop")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup", a.warmup, "untimed ops before timing");
  app.add_option("--reps", a.reps, "timed loops; the median is reported")->check(CLI::PositiveNumber);
  app.add_flag("--check", a.check, "compare every rank's C with the exact product (mk::verifyFused's tolerance)");
  app.add_option("--samples", a.samples, "--check: random elements per rank (0 = every element)");
  app.add_option("--json", a.json, "write measurement records (mkernel.measurement.v1) to this file");
  app.add_option("--trace", a.trace, "write the last shape's last fused op as Chrome trace JSON");
  const std::string tool = std::string("mk-bench ") + argv[0];
  if (int rc = mk::cli::parse(app, argc, argv, tool.c_str()); rc != mk::cli::kContinue) return rc;
  try {
    mk::checkDistinctOutputs({{"--json", a.json, mk::OutputKind::File}, {"--trace", a.trace, mk::OutputKind::File}});
    return runFused(a, command);
  } catch (const mk::Error& e) {  // no GPU 3, driver too old 4, the rest 2 (mk/util/cli.hpp)
    std::fprintf(stderr, "mk-bench %s: %s\n", a.op.c_str(), e.what());
    return mk::cli::exitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mk-bench %s: %s\n", a.op.c_str(), e.what());
    return 2;
  }
}

}  // namespace mkbench

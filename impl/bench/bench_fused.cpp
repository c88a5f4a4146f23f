// mk-bench gemm-rs | ag-gemm | gemm-ar — the fused operators (docs/fused-operators.md) against the unfused program,
// nccl-tests style, on the GPUs of this machine, or across nodes of one process per rank.
//
//   mk-bench gemm-rs [-b 2048] [-e 16384] [-f 2] [-m M -n N -k K] [--ranks R] [--layout-b row|col] [--tile-rows T]
//                    [--order auto|own-first|own-last|interleaved] [--comm-ctas C] [--compute-lanes L]
//                    [--iters I] [-w W] [--reps R] [--check] [--samples S] [--json f] [--trace f]
//   impl/tools/launch_ranks.sh [--mps] P mk-bench gemm-rs --ranks-per-node N --transport socket --share-gpus ...
//
// Shapes: M = N = b, K = b / 2 for b = -b, -b * -f, ... <= -e (the public mKernel benchmark's), or one -m -n -k.
// Ranks: R ranks of one process on the visible GPUs in turn; more ranks than GPUs share them (CommConfig::shareGpus,
// each rank's resident kernel holding its share of the SMs). Or one process per rank (launch_ranks.sh, torchrun,
// mpirun; bench_launch.hpp), nodes of --ranks-per-node ranks: the fused schedule's cross-node tiles are ProxyPuts the
// proxy moves over --transport while the compute lanes run the GEMM tiles. Rank 0 prints and writes --json; every
// time is the largest median over the ranks.
//
// Columns, per shape (medians over --reps loops of --iters back-to-back ops, CUDA events, nccl-tests style):
//  * fused_us: the fused op through Communicator (one op per rank per iteration, one group per loop);
//  * gemm_us: each rank's GEMM by cuBLASLt with no communicator alive (every SM): in one process one after another
//    on one stream; one process per rank: every process at once;
//  * coll_us: the collective alone: NCCL's when every rank of one process has a GPU of its own; NCCL refuses two
//    ranks on one GPU ("duplicate GPU"), so when ranks share a GPU, and across the nodes of one process per rank, it
//    is mkernel's own collective (auto algorithm, communication-only kernel, the same proxy and transport), labelled
//    "mkernel"; on one rank there is none;
//  * base_us: the unfused program. With a GPU per rank, cuBLASLt GEMM and NCCL collective run one after the other on
//    each rank's stream (all-gather first for ag-gemm), timed as such (fused_baseline.hpp); one process per rank the
//    same with mkernel's collective, every op waited for on its stream; with shared GPUs in one process, the parts
//    timed alone and summed (a lower bound on running them one after the other). bound_us = max(gemm_us, coll_us):
//    the physical bound of any overlap; speedup = base_us / fused_us; TFLOP/s = 2 m n k / fused_us.
// --check: every rank's C against the exact product under mk::verifyFused's tolerance, at --samples random elements
// per rank (0 = all); one process per rank: each checks its own ranks, and the run fails on every process if any
// fails. --trace (one process): the last shape's last fused op as Chrome trace JSON.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "bench_fused_cli.hpp"
#include "bench_fused_report.hpp"
#include "bench_launch.hpp"
#include "cublaslt_loader.hpp"
#include "fused_baseline.hpp"
#include "fused_check.hpp"
#include "lowering/lowering.hpp"
#include "mk/communicator.hpp"
#include "mk/cuda_check.hpp"
#include "mk/device_info.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/util/cli.hpp"

namespace mkbench {
namespace {

/// The communicator settings every communicator of a run shares (the fused one adds compute lanes).
mk::CommConfig commConfig(const FusedArgs& a, bool shared) {
  mk::CommConfig cfg;
  cfg.shareGpus = shared;
  cfg.ranksPerNode = a.ranksPerNode;
  cfg.transport = proxyTransport(a.transport);
  return cfg;
}

int runFused(const FusedArgs& a, const FusedJob& job, const std::string& command) {
  const mk::FusedOp op = job.op;
  const int available = mk::requireCudaDevices();
  Launch launch;
  if (job.multiProcess) {
    launch = launchFromEnvironment();
    if (job.ranks == 0) checkFusedWorld(a, job, static_cast<uint32_t>(launch.nRanks));  // the MPI bootstrap's size
  } else {
    std::vector<int> devs;
    for (uint32_t r = 0; r < a.ranks; ++r) devs.push_back(static_cast<int>(r % static_cast<uint32_t>(available)));
    launch = launchLocal(std::move(devs));
  }
  const auto ranks = static_cast<uint32_t>(launch.nRanks);
  const auto first = static_cast<uint32_t>(launch.firstRank);
  const std::vector<int>& devs = launch.devs;
  const std::size_t local = devs.size();
  const bool leader = launch.leader();
  const bool shared = job.multiProcess ? a.shareGpus : ranks > static_cast<uint32_t>(available);
  const int gpus =
      job.multiProcess && !a.shareGpus ? static_cast<int>(ranks) : std::min<int>(available, static_cast<int>(ranks));
  cudaDeviceProp prop{};
  MK_CUDA_CHECK(cudaGetDeviceProperties(&prop, devs[0]));
  MK_CUDA_CHECK(cudaSetDevice(devs[0]));
  CublasLt lt;
  const BaselineTiming timing{a.iters, a.warmup, a.reps};
  const bool ncclBase = !job.multiProcess && ranks > 1 && !shared;  // a GPU per rank: the unfused program on NCCL
  if (leader) {
    std::printf(
        "# mk-bench %s: %u rank(s)%s on %d x %s (%d SMs)%s, bf16, B %s-major, iters %llu, warmup %llu, "
        "reps %llu\n",
        a.op.c_str(), ranks, job.multiProcess ? " (one process per rank)" : "", gpus, prop.name,
        prop.multiProcessorCount, shared ? ", ranks SHARE the GPU (not the multi-GPU targets)" : "", a.layoutB.c_str(),
        static_cast<unsigned long long>(a.iters), static_cast<unsigned long long>(a.warmup),
        static_cast<unsigned long long>(a.reps));
    if (job.multiProcess)
      std::printf(
          "# baseline: cuBLASLt %s GEMM, then mkernel's collective (auto algorithm, communication-only kernel, the "
          "same proxy and transport) one after the other on each rank's stream, every op waited for (base); each "
          "alone (gemm, coll); bound = max; every time the largest median over the ranks\n",
          lt.version().c_str());
    else if (ncclBase)
      std::printf(
          "# baseline: cuBLASLt %s GEMM and NCCL collective one after the other on each rank's stream (base); "
          "each alone (gemm, coll); bound = max\n",
          lt.version().c_str());
    else
      std::printf(
          "# baseline: cuBLASLt %s GEMM%s, parts timed alone in this run and summed (base = gemm + coll; bound = "
          "max)\n",
          lt.version().c_str(),
          ranks == 1 ? " (one rank: no collective)"
                     : " + mkernel's own collective (communication-only kernel; NCCL refuses two ranks on one GPU)");
    printFusedHeader();
  }
  mk::MeasurementFile file = newMeasurementFile(gpus, "", command);
  file.system["cublaslt"] = quoted(lt.version());
  if (shared) file.system["ranks_share_gpu"] = "true";
  FusedRunInfo info;
  info.op = a.op;
  info.layoutB = a.layoutB;
  info.ranks = ranks;
  info.gpus = static_cast<uint32_t>(gpus);
  info.sms = static_cast<uint32_t>(prop.multiProcessorCount);
  info.shared = shared;
  info.processes = job.multiProcess ? ranks : 1;
  info.ranksPerNode = a.ranksPerNode;
  info.iters = a.iters;
  info.samples = a.samples;
  if (job.multiProcess) file.system["processes"] = std::to_string(ranks);
  bool allOk = true;
  uint64_t seed = launch.fromLeader(std::random_device{}());  // every process draws the same A and B
  for (std::size_t si = 0; si < job.shapes.size(); ++si) {
    const FusedShape& sh = job.shapes[si];
    const mk::FusedSpec spec{op, mk::DType::BFloat16, sh.m, sh.n, sh.k, job.layoutB};
    const FusedHostData d = makeFusedInputs(spec, ranks, ++seed);
    const bool ag = op == mk::FusedOp::AllGatherGemm, ar = op == mk::FusedOp::GemmAllReduce;
    // ---- buffers of this process's ranks (i: local index, first + i: the rank), before any communicator: a, b, c;
    // the baseline's GEMM output (rs / ar: the m x n partial; ag: C) and collective output (rs / ar: C; ag: the
    // gathered m x k A).
    std::vector<std::unique_ptr<Dev>> A, B, C, gemmOut, collOut;
    for (std::size_t i = 0; i < local; ++i) {
      const uint32_t r = first + static_cast<uint32_t>(i);
      MK_CUDA_CHECK(cudaSetDevice(devs[i]));
      A.push_back(std::make_unique<Dev>(d.a[r].size() * 2));
      B.push_back(std::make_unique<Dev>(d.b[r].size() * 2));
      C.push_back(std::make_unique<Dev>(fusedOutputCount(d, r) * 2));
      gemmOut.push_back(std::make_unique<Dev>((ag ? fusedOutputCount(d, r) : sh.m * sh.n) * 2));
      collOut.push_back(std::make_unique<Dev>((ag ? sh.m * sh.k : fusedOutputCount(d, r)) * 2));
      MK_CUDA_CHECK(cudaMemcpy(A[i]->p, d.a[r].data(), d.a[r].size() * 2, cudaMemcpyHostToDevice));
      MK_CUDA_CHECK(cudaMemcpy(B[i]->p, d.b[r].data(), d.b[r].size() * 2, cudaMemcpyHostToDevice));
      MK_CUDA_CHECK(cudaMemset(C[i]->p, 0xFF, fusedOutputCount(d, r) * 2));  // NaN until written
    }
    Streams st(devs);
    FusedShapeTimes t;
    t.spec = spec;
    // ---- the fused op, every variant on one communicator
    {
      mk::CommConfig cfg = commConfig(a, shared);
      cfg.computeLanes = true;
      cfg.trace = !a.trace.empty() && si + 1 == job.shapes.size();
      auto comms = createCommunicators(launch, cfg);
      info.nodes = comms[0].topology().nodes;
      info.transport = comms[0].interNodeTransport();
      if (info.nodes > 1) {
        file.system["nodes"] = std::to_string(info.nodes);
        file.system["transport"] = mkbench::quoted(info.transport);
      }
      const std::vector<uint32_t> layout = comms[0].topology().layout(ranks);
      for (const mk::FusedOptions& opt : job.variants) {
        Variant row;
        row.opt = opt;
        row.plan = comms[0].fusedPlan(spec, opt);
        row.workers = comms[0].workerCtas();
        // The split the lowering gives this process's first rank's lanes (what ran, not only what the plan weighs).
        const mk::Schedule s = mk::generate(spec, layout, row.plan.opt);
        mk::runtime::LowerOptions lo;
        lo.nWorkers = row.workers;
        const mk::runtime::LoweredProgram prog = mk::runtime::lowerRank(s, first, lo);
        for (uint32_t l = 0; l < prog.nLanes; ++l)
          (s.lanes[first][l].role == mk::LaneRole::Compute ? row.computeCtas : row.commCtas) +=
              prog.lanes()[l].ctaCount;
        for (std::size_t i = 0; i < local; ++i)  // NaN until written
          MK_CUDA_CHECK(
              cudaMemsetAsync(C[i]->p, 0xFF, fusedOutputCount(d, first + static_cast<uint32_t>(i)) * 2, st.s[i]));
        st.sync();
        launch.barrier();
        row.fusedUs = launch.maxOverProcesses(timeLoopUs(timing, st, true, [&] {
          for (std::size_t i = 0; i < local; ++i) comms[i].fused(spec, A[i]->p, B[i]->p, C[i]->p, st.s[i], opt);
        }));
        for (auto& c : comms) c.synchronize();
        if (a.check) {
          row.checked = true;
          for (std::size_t i = 0; i < local; ++i) {
            const uint32_t r = first + static_cast<uint32_t>(i);
            std::vector<uint16_t> c(fusedOutputCount(d, r));
            MK_CUDA_CHECK(cudaMemcpyAsync(c.data(), C[i]->p, c.size() * 2, cudaMemcpyDeviceToHost, st.s[i]));
            MK_CUDA_CHECK(cudaStreamSynchronize(st.s[i]));
            const FusedCheck chk = checkFusedOutput(d, r, c.data(), a.samples, seed + r);
            row.worst = std::max(row.worst, chk.worstRatio);
            if (!chk.ok() && row.first.empty()) row.first = chk.first;
            row.ok = row.ok && chk.ok();
          }
          if (launch.multiProcess()) {  // the job's verdict: every process's
            for (double w : allGatherValue(*launch.boot, row.worst)) row.worst = std::max(row.worst, w);
            for (uint8_t ok : allGatherValue(*launch.boot, static_cast<uint8_t>(row.ok))) row.ok = row.ok && ok != 0;
          }
        }
        t.rows.push_back(row);
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
    // ---- the unfused program: every rank's GEMM of its shard into gemmOut (ag: from the gathered A), the collective
    const uint64_t shardRows = sh.m / ranks;
    const bool collRuns = ranks > 1 && (ar || sh.m % ranks == 0);  // reduce-scatter / all-gather: equal row blocks
    t.haveBase = ranks == 1 || collRuns;
    BaselineCollective bc;
    bc.op = ag ? mk::CollOp::AllGather : ar ? mk::CollOp::AllReduce : mk::CollOp::ReduceScatter;
    bc.first = ag;
    bc.count = ag ? shardRows * sh.k : ar ? sh.m * sh.n : shardRows * sh.n;
    std::vector<mk::GemmProblem> gemms;
    for (std::size_t i = 0; i < local; ++i) {
      const mk::FusedShard& fs = d.shards[first + i];
      mk::GemmProblem pr;
      pr.m = static_cast<int64_t>(sh.m);
      pr.n = static_cast<int64_t>(fs.cols);
      pr.k = static_cast<int64_t>(fs.kLen);
      pr.lda = pr.k;
      pr.layoutB = job.layoutB == mk::MatrixLayout::ColMajor ? mk::GemmLayout::ColMajor : mk::GemmLayout::RowMajor;
      pr.ldb = pr.layoutB == mk::GemmLayout::ColMajor ? pr.k : pr.n;
      pr.ldc = pr.n;
      pr.outDType = mk::DType::BFloat16;
      pr.a = ag ? collOut[i]->p : A[i]->p;  // ag: the gathered A (whatever it holds: timing only)
      pr.b = B[i]->p;
      pr.c = gemmOut[i]->p;
      gemms.push_back(pr);
      bc.send.push_back(ag ? A[i]->p : gemmOut[i]->p);
      bc.recv.push_back(collOut[i]->p);
    }
    const std::string collName = mk::toString(bc.op);
    if (job.multiProcess && collRuns) {
      // ---- one process per rank: cuBLASLt then mkernel's collective across the nodes, through the same transport
      const EngineBaseline eb = timeCublasThenEngine(launch, st, lt, gemms, bc, timing, commConfig(a, shared));
      t.gemmUs = eb.gemmUs;
      t.collUs = eb.collUs;
      t.baseUs = eb.sequentialUs;
      t.baseImpl = "cublas+mkernel";
      t.baseAlgo = "cublaslt then " + collName + " " + eb.algo;
      t.baseHow =
          "GEMM and mkernel's collective (communication-only kernel, same transport) one after the other on each "
          "rank's stream, timed; the largest median over the ranks";
    } else if (ncclBase && collRuns) {
      // ---- baseline on NCCL: a GPU per rank, no communicator alive
      const NcclBaseline nb = timeCublasThenNccl(devs, st, gemms, bc, timing);
      t.gemmUs = nb.gemmUs;
      t.collUs = nb.collUs;
      t.baseUs = nb.sequentialUs;
      t.baseImpl = "cublas+nccl";
      t.baseAlgo = "cublaslt then nccl " + nb.ncclVersion + " " + collName;
      t.baseHow = "GEMM and collective one after the other on each rank's stream, timed";
      file.system["nccl"] = quoted(nb.ncclVersion);
    } else {
      // ---- one process, ranks sharing GPUs (or one rank): each rank's GEMM by cuBLASLt (no communicator alive),
      // then the collective alone
      {
        std::vector<CublasLt::Plan> plans;
        for (const mk::GemmProblem& g : gemms) plans.push_back(lt.plan(g));
        Streams one({devs[0]});
        t.gemmUs = timeLoopUs(timing, one, true, [&] {
          for (const CublasLt::Plan& p : plans) lt.run(p, one.s[0]);
        });
      }
      std::string algo;
      if (collRuns) {
        auto comms = createCommunicators(launch, commConfig(a, shared));
        t.collUs = timeLoopUs(timing, st, true, [&] {
          for (std::size_t i = 0; i < local; ++i) submitEngineCollective(comms[i], bc, i, st.s[i]);
        });
        algo = std::string(" ") + mk::toString(comms[0].chooseAlgorithm(bc.op, bc.count, mk::DType::BFloat16));
      }
      t.baseUs = t.gemmUs + t.collUs;  // the shared-GPU (or one-rank) baseline: the parts summed
      t.baseImpl = ranks == 1 ? "cublas" : "cublas+mkernel";
      t.baseAlgo = ranks == 1 ? "cublaslt-heuristic" : "cublaslt then " + collName + algo;
      t.baseHow = "parts timed alone in the same run and summed";
    }
    reportFusedShape(info, t, leader, file);
    for (const Variant& row : t.rows) allOk = allOk && row.ok;
  }
  if (!a.json.empty() && leader) mk::saveMeasurementFile(file, a.json);
  if (!allOk) {
    std::fprintf(stderr, "mk-bench %s: check FAILED\n", a.op.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int fusedMain(int argc, char** argv, const std::string& command) {
  FusedArgs a;
  FusedJob job;
  if (int rc = parseFusedArgs(argc, argv, a, job); rc != mk::cli::kContinue) return rc;
  const std::string tool = "mk-bench " + a.op;
  // no GPU 3, driver too old 4, bad input 2, the rest 1 (mk/util/cli.hpp)
  return mk::cli::run(tool.c_str(), [&] { return runFused(a, job, command); });
}

}  // namespace mkbench

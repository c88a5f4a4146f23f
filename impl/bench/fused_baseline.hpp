// mk-bench gemm-rs | ag-gemm | gemm-ar — internal: the unfused program, cuBLASLt GEMM and the collective one after the
// other on each rank's stream, as a framework runs a tensor-parallel linear layer: on NCCL where every rank has a GPU
// of its own, or on mkernel's own collective (communication-only kernel) across the nodes of one process per rank.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_launch.hpp"
#include "cublaslt_loader.hpp"
#include "mk/algorithms/algorithms.hpp"
#include "mk/gemm.hpp"

namespace mkbench {

/// How to time (nccl-tests style: --warmup untimed, then the median over --reps loops of --iters).
struct BaselineTiming {
  uint64_t iters = 20, warmup = 5, reps = 5;
};

/// Median of timing.reps loops of timing.iters calls of `body` (after timing.warmup untimed ones), in microseconds per
/// call, timed on every stream of `st`. `grouped`: each loop is one group (mk::groupStart / groupEnd), so only the last
/// engine op per stream waits for completion; otherwise every engine op makes its stream wait (what a framework's
/// "GEMM, then the collective" does, so the next GEMM never overlaps the previous collective).
template <class Body>
double timeLoopUs(const BaselineTiming& timing, Streams& st, bool grouped, Body&& body) {
  auto loop = [&](uint64_t n) {
    if (!grouped) {
      for (uint64_t i = 0; i < n; ++i) body();
      return;
    }
    mk::groupStart();
    try {
      for (uint64_t i = 0; i < n; ++i) body();
    } catch (...) {
      mk::groupEnd();
      throw;
    }
    mk::groupEnd();
  };
  loop(timing.warmup);
  st.sync();
  std::vector<double> samples;
  for (uint64_t r = 0; r < timing.reps; ++r) {
    st.recordStart();
    loop(timing.iters);
    samples.push_back(st.recordStopAndElapsedMs() * 1e3 / static_cast<double>(timing.iters));
  }
  return median(samples);
}

/// The collective the unfused program runs beside its GEMM, per rank (NCCL's count conventions: all-gather and
/// reduce-scatter count one rank's block, all-reduce the whole buffer).
struct BaselineCollective {
  mk::CollOp op = mk::CollOp::ReduceScatter;
  std::vector<const void*> send;
  std::vector<void*> recv;
  uint64_t count = 0;
  bool first = false;  ///< the collective runs before the GEMM (all-gather + GEMM), else after it
};

/// Medians in microseconds: the sequence (each rank's GEMM and the collective, in program order on the rank's stream,
/// every rank at once), and each part alone.
struct NcclBaseline {
  double sequentialUs = 0, gemmUs = 0, collUs = 0;
  std::string ncclVersion, cublasVersion;
};

/// Rank r runs on devs[r] with stream st.s[r]; gemms[r] is its GEMM (pointers on that device). Needs one GPU per rank
/// (NCCL refuses two ranks on one GPU) and libnccl.so.2 / libcublasLt at run time: mk::Error(Unsupported) otherwise.
/// No mkernel communicator may be alive on these GPUs.
NcclBaseline timeCublasThenNccl(const std::vector<int>& devs, Streams& st, const std::vector<mk::GemmProblem>& gemms,
                                const BaselineCollective& coll, const BaselineTiming& timing);

/// Submit rank r's part of `coll` (coll.send[r] / recv[r]) through mkernel's own collective on `comm`, algorithm
/// "auto" (the engine's choice for the communicator's nodes).
void submitEngineCollective(mk::Communicator& comm, const BaselineCollective& coll, std::size_t r, cudaStream_t stream);

/// Medians in microseconds of the unfused program on mkernel's collective; each the largest over the processes.
struct EngineBaseline {
  double sequentialUs = 0, gemmUs = 0, collUs = 0;
  std::string algo;  ///< the collective's algorithm ("auto" chose it)
};

/// The unfused program of this process's ranks (`launch`: one process per rank, or one process), every process at
/// once: gemm alone (cuBLASLt `lt`, no communicator alive), then on a communication-only communicator of `cfg`
/// (cfg.computeLanes is cleared: the GEMM keeps the SMs the resident kernel does not hold) the collective alone
/// (grouped loops) and the sequence, GEMM and collective one after the other on each rank's stream (all-gather first
/// for ag-gemm), every op waited for on its stream. gemms[i], coll.send / recv [i] and st.s[i] belong to launch's
/// i-th rank. No other communicator may be alive.
EngineBaseline timeCublasThenEngine(const Launch& launch, Streams& st, const CublasLt& lt,
                                    const std::vector<mk::GemmProblem>& gemms, const BaselineCollective& coll,
                                    const BaselineTiming& timing, mk::CommConfig cfg);

}  // namespace mkbench

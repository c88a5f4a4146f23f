// mk-bench gemm-rs | ag-gemm | gemm-ar — internal: the unfused program on ranks that each have a GPU of their own,
// cuBLASLt GEMM and NCCL collective one after the other, as a framework on NCCL runs a tensor-parallel linear layer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "mk/algorithms/algorithms.hpp"
#include "mk/gemm.hpp"

namespace mkbench {

/// How to time (nccl-tests style: --warmup untimed, then the median over --reps loops of --iters).
struct BaselineTiming {
  uint64_t iters = 20, warmup = 5, reps = 5;
};

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

}  // namespace mkbench

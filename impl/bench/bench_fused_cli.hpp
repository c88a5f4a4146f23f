// mk-bench gemm-rs | ag-gemm | gemm-ar — the command line and every check that needs no GPU, host-only (no CUDA
// header): mk-bench-cli parses it exactly as mk-bench does, so the CPU build tests its bad-input answers.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "mk/algorithms/fused.hpp"

namespace mkbench {

/// What `mk-bench <fused op>` was asked to do.
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
  uint32_t ranksPerNode = 0;  ///< one process per rank: nodes of this many ranks (CommConfig::ranksPerNode)
  std::string transport = "auto";
  bool shareGpus = false;
};

/// One shape C[m x n] = A[m x k] B[k x n].
struct FusedShape {
  uint64_t m, n, k;
};

/// The run `FusedArgs` resolve to, every word and shape checked.
struct FusedJob {
  mk::FusedOp op = mk::FusedOp::GemmReduceScatter;
  mk::MatrixLayout layoutB = mk::MatrixLayout::RowMajor;
  std::vector<FusedShape> shapes;
  std::vector<mk::FusedOptions> variants;  ///< every --tile-rows x --comm-ctas combination
  /// Started as one process per rank (RANK / WORLD_SIZE or an MPI launcher's variables): each process drives one rank.
  bool multiProcess = false;
  /// Ranks of the job: --ranks in one process, WORLD_SIZE of one process per rank (0: not known before the MPI
  /// bootstrap; checkFusedWorld then runs once it is).
  uint32_t ranks = 1;
};

/// Every option of `mk-bench <fused op>` on `app`, bound to `a`.
void addFusedArgs(CLI::App& app, FusedArgs& a);

/// Resolve and check `a` before any GPU is looked for: the op, --order, --layout-b, the shapes, the variant lists;
/// options that contradict the launch (--ranks or --trace in a process started as one rank; --ranks-per-node,
/// --transport other than auto, in one process); --transport ibverbs without an RDMA device here; and, when the
/// job's size is known, checkFusedWorld. Throws Error(InvalidArgument / Unsupported) naming the option.
FusedJob resolveFusedArgs(const FusedArgs& a);

/// The checks that need the job's size `world`: every shape divides over the ranks as the op needs
/// (mk::validateFusedSpec), and — one process per rank — as the layered baseline's collective needs (m a multiple of
/// the ranks for gemm-rs and ag-gemm), --ranks-per-node divides `world`. Throws Error(InvalidArgument).
void checkFusedWorld(const FusedArgs& a, const FusedJob& job, uint32_t world);

/// Parse `mk-bench <fused op> ...` (argv[0] the op) into `a` and resolve it into `job`: mk::cli::kContinue, or the
/// exit code after --help (0) or one "mk-bench <op>: error: ..." line (2).
int parseFusedArgs(int argc, char** argv, FusedArgs& a, FusedJob& job);

}  // namespace mkbench

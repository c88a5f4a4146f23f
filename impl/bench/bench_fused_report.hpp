// mk-bench gemm-rs | ag-gemm | gemm-ar — internal: the table and the measurement records of one shape (what was
// measured in bench_fused.cpp, printed and recorded here).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_fused_cli.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/io/measurement.hpp"

namespace mkbench {

/// One fused variant (options) of a shape, as measured.
struct Variant {
  mk::FusedOptions opt;  ///< as asked
  mk::FusedPlan plan;    ///< as run
  uint32_t workers = 0, computeCtas = 0, commCtas = 0;
  double fusedUs = 0;
  bool checked = false, ok = true;
  double worst = 0;
  std::string first;  ///< this process's first mismatch
};

/// What every record of a run shares.
struct FusedRunInfo {
  std::string op, layoutB;
  uint32_t ranks = 1, gpus = 1, sms = 0;
  bool shared = false;        ///< ranks share GPUs
  uint32_t processes = 1;     ///< one process per rank: the ranks
  uint32_t nodes = 1;         ///< nodes of the communicator (the proxy joins them)
  uint32_t ranksPerNode = 0;  ///< --ranks-per-node (0: one node per host)
  std::string transport;      ///< the proxy's transport; empty on one node
  uint64_t iters = 0, samples = 0;
};

/// One shape's measurements: the fused variants and the unfused program.
struct FusedShapeTimes {
  mk::FusedSpec spec;
  std::vector<Variant> rows;
  bool haveBase = false;  ///< the unfused program ran (one rank, or a collective of equal blocks)
  double gemmUs = 0, collUs = 0, baseUs = 0;
  std::string baseImpl, baseAlgo, baseHow;  ///< the baseline record's impl, algo and "baseline" text
};

/// The column header of the table.
void printFusedHeader();

/// Print the table rows of one shape (when `print`: the leading process) and append its records to `file`.
void reportFusedShape(const FusedRunInfo& info, const FusedShapeTimes& t, bool print, mk::MeasurementFile& file);

}  // namespace mkbench

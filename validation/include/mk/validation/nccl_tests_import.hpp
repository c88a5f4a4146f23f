// mkernel — import what users have measured on their own cluster (nccl-tests output, bus-bandwidth tables) and
// fit the profile's efficiencies from it through the layered model (docs/calibration.md, "Importing nccl-tests
// output").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/cost/cost.hpp"
#include "mk/schedule/types.hpp"
#include "mk/topology/topology.hpp"

namespace mk {

/// One measured collective: an out-of-place row of nccl-tests or a row of a bus-bandwidth table.
struct BusBwRow {
  CollOp op = CollOp::AllReduce;
  uint64_t bytes = 0;  ///< nccl-tests' "size": the larger per-rank buffer (countForBytes' convention)
  DType dtype = DType::Float32;
  double timeUs = 0;           ///< per op; 0 = not given (a table without time_us: taken from busBwGBs)
  double busBwGBs = 0;         ///< bus bandwidth as nccl-tests defines it (algbw x busBwFactor), 0 = not given
  uint32_t launchesPerOp = 1;  ///< GPUs one thread of the run drove (nccl-tests' "nGpus"): kernels it launched per op
  std::string where;           ///< "file:line", for messages and the fit table
};

/// What one input file holds.
struct BusBwInput {
  std::vector<BusBwRow> rows;
  uint32_t ranks = 0;  ///< ranks the run reports ("#  Rank" lines of nccl-tests); 0 = not said
};

/// nccl-tests' text output (all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf, broadcast_perf):
/// "#" lines (the op from "# Collective test starting: <name>", the ranks from "#  Rank" lines, launches from
/// "# nThread .. nGpus N"), lines of NCCL's debug log (" NCCL ") skipped, and result rows of 13 columns: size
/// count type redop root, then time algbw busbw #wrong out-of-place and in-place (the out-of-place ones are
/// read). Throws Error(ParseError) naming `path`:line for a row of another column count, a size or count that is
/// not an integer, a time or bandwidth that is not a number, a row with wrong elements, an unknown test or type.
BusBwInput parseNcclTests(const std::string& text, const std::string& path);

/// A bus-bandwidth table (CSV): "#" comment lines, a header naming the columns with their units, `op`, `bytes`,
/// `busbw_GBs` and optionally `time_us` (any order), then one row per measurement (op as mkernel names it:
/// allreduce, allgather, reducescatter, alltoall, broadcast). Throws Error(ParseError) naming `path`:line for a
/// header without units (`busbw`, `time`), an unknown or missing column, a row with another column count, a
/// non-number, a size that is not an integer.
BusBwInput parseBusBwTable(const std::string& text, const std::string& path);

/// Reads `path` (size-limited) and parses it as nccl-tests output when its first non-empty line starts with "#"
/// and names nccl-tests, else as a bus-bandwidth table.
BusBwInput readBusBwFile(const std::string& path);

/// One row of the fit: what the fitted model predicts for it.
struct BusBwRowFit {
  BusBwRow row;
  std::string regime;   ///< "bandwidth" (fits the efficiency), "latency" (fits the per-message latency), "-"
  double modelUs = 0;   ///< the layered model under the fitted profile ("nccl auto", layeredOpUs)
  double residual = 0;  ///< (model - measured) / measured
};

/// What fitBusBw() fitted.
struct BusBwFit {
  Profile profile;             ///< `base` with the fitted rate (and latency) set
  bool network = false;        ///< across nodes: network efficiency and transport latency; one node: NVLink efficiency
  double efficiency = 1;       ///< fitted fraction of the datasheet rate (`base`'s rate) the rows reach
  double latencyUs = 0;        ///< fitted transport.latencyUs (network only)
  bool latencyFitted = false;  ///< false: no latency rows (or one node), the base's latency is kept
  std::vector<BusBwRowFit> rows;
};

/// Fit the efficiencies of `base` (normally defaultProfile(topo): the cluster's datasheet) so that the layered
/// model ("nccl auto" under layeredProfile, per op layeredOpUs with the row's launchesPerOp) on every GPU of `topo`
/// matches the rows, by least squares of the relative error per regime: rows of >= 16 MiB fit the rate (network
/// across nodes, NVLink on one node), rows of <= 64 KiB across nodes then the transport's per-message latency.
/// Throws Error(InvalidArgument) naming the file when fewer than 2 rows are >= 16 MiB, when a row's busbw and
/// time disagree for topo's rank count, or when the rows are faster than the datasheet allows.
BusBwFit fitBusBw(const std::vector<BusBwRow>& rows, const Topology& topo, const Profile& base);

/// The fit as a table (one line per row: where, op, bytes, measured, model, residual, regime), then the fitted
/// parameters.
std::string formatBusBwFit(const BusBwFit& fit);

}  // namespace mk

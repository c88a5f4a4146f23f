// mkernel — from what a user asks on a command line (cluster, nodes, ranks, bytes) to a placement and a count.
//
// Shared by every tool (mk-schedule, mk-sim, ...) so that "--ranks 8 --bytes 1MiB" means the same thing in all;
// mk/util/cli_collective.hpp adds the options that fill CollectiveArgs to a command line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/cost/cost.hpp"
#include "mk/topology/topology.hpp"

namespace mk {

/// Count argument of `op` whose larger per-rank buffer holds at most `bytes` (nccl-tests' "size"), rounded down
/// to whole elements — per rank block for allgather, reducescatter and alltoall. 0 when `bytes` holds less than
/// one element (per rank block).
uint64_t countForBytes(CollOp op, uint64_t bytes, DType dtype, uint32_t nRanks) noexcept;

/// Smallest `bytes` for which countForBytes() is at least 1.
uint64_t minBytesFor(CollOp op, DType dtype, uint32_t nRanks) noexcept;

/// countForBytes(), or Error(InvalidArgument) "--bytes <bytes> holds less than one <dtype> element per rank (need
/// at least <minBytesFor> bytes)" when it is 0.
uint64_t requireCountForBytes(CollOp op, uint64_t bytes, DType dtype, uint32_t nRanks);

/// A collective as a command line names it, words and numbers as typed (the defaults are the tools').
struct CollectiveArgs {
  std::string op = "allreduce";
  std::string algo = "ring";  ///< a generator name, or "auto" (policy.hpp)
  std::string cluster = kDefaultCluster;
  uint32_t nodes = 0;  ///< 0: the cluster's own count, grown to hold `ranks`
  uint32_t ranks = 0;  ///< 0: every GPU
  std::string bytes = "1MiB";
  std::string dtype = "float32";
  std::string redop = "sum";
  uint32_t root = 0;
  uint32_t chunks = 1;
  uint32_t channels = 1;
  bool chunksGiven = false;    ///< `chunks` was asked for: kept instead of the engine's rule for the size
  bool channelsGiven = false;  ///< likewise `channels`
  std::string inter = "auto";
  std::string protocol = "auto";  ///< nccl-* only: simple, ll, ll128, or auto (the lowest closed form)
  std::string profile;            ///< profile file (mkernel.profile.v1); empty: the cluster's datasheet defaults
  // The fused operators (--op gemm-rs | ag-gemm | gemm-ar, fused.hpp): the whole GEMM and the schedule's shape.
  uint64_t m = 0, n = 0, k = 0;    ///< C[m x n] = A[m x k] B[k x n]; required for a fused op
  uint32_t tileRows = 0;           ///< 0: planFused's default (one wave of CTAs per Gemm step)
  std::string order = "auto";      ///< own-first, own-last, interleaved, or auto (the lowest closed form)
  uint32_t ctas = 0;               ///< 0: the GPU's SMs less the engine's reserve
  uint32_t commCtas = 0;           ///< 0: the split with the lowest closed form
  uint32_t computeLanes = 0;       ///< 0: 1, 2 or 4 by the lowest closed form
  std::string layoutB = "row";     ///< row or col
  std::vector<std::string> given;  ///< the options named on the command line ("--bytes", ...)
};

/// The words of CollectiveArgs checked and typed; the size is still open.
struct CollectiveRequest {
  CollectiveSpec spec;            ///< count 0: the tool sizes it (one --bytes, or every size of a sweep)
  std::optional<Algorithm> algo;  ///< empty: "auto", decided per size by planCollective()
  /// `--algo nccl`: NCCL's own choice of layered algorithm and protocol per size (planNccl, nccl.hpp); algo empty.
  bool ncclAuto = false;
  GenOptions gen;  ///< chunks and channels not given are 0: the engine's rule per size (policy.hpp)
};

/// Check the words of `a` with the one spelling of each error: requireCollOp (what "--op"), requireDType
/// ("--dtype"), requireRedOp ("--redop"), requireAlgorithm unless "auto", and the inter-node phase; an option
/// of the fused ops named in `a.given` is refused. Throws Error(InvalidArgument), or Error(NotFound) for an
/// algorithm without a generator for the op.
CollectiveRequest parseCollective(const CollectiveArgs& a);

/// Whether `op` names a fused operator (gemm-rs, ag-gemm, gemm-ar; parseFusedOp).
bool isFusedOp(std::string_view op) noexcept;

/// A fused op as a command line asks for it; what the options leave open (0, auto) planFused() decides.
struct FusedRequest {
  FusedSpec spec;
  FusedOptions opt;
};

/// The words of `a` for a fused op: --op (requireFusedOp), --m, --n and --k (required), --dtype (bfloat16 unless
/// named in `a.given`), --layout-b, --order, --tile-rows, --ctas, --comm-ctas, --compute-lanes; an option of the
/// collectives named in `a.given` (--bytes, --algo, --redop, --root, --chunks, --channels, --inter) is refused. The
/// shape rules are validateFusedSpec's, checked once the rank count is known. Throws Error(InvalidArgument).
FusedRequest parseFused(const CollectiveArgs& a);

/// The profile `a` prices with: its file applied to `topo` (loadProfileFor), else the datasheet defaults of `topo`.
Profile profileFor(const CollectiveArgs& a, const Topology& topo);

/// `p` with Profile::sms and Profile::ctaGBs taken from the datasheet defaults of `topo` where it has none (a
/// profile file written before the CTA split was modelled, as every calibrated one so far), so that a fused op's
/// split is priced (timeline rule 2b); the returned list names the fields filled ("sms", "ctaGBs").
std::vector<std::string> fillCtaDefaults(Profile& p, const Topology& topo);

/// Where a request runs.
struct Placement {
  Topology topo;
  uint32_t nRanks = 0;
};

/// The cluster `cluster` (preset or topology file) with `nodes` nodes — 0 means the cluster's own count, grown to
/// hold `ranks` and to at least `minNodes` — and `ranks` ranks placed node-major (0 means every GPU). Throws
/// Error(InvalidArgument) when `ranks` does not fit explicit `nodes`, plus whatever loadTopology throws.
Placement placeRanks(const std::string& cluster, uint32_t nodes, uint32_t ranks, uint32_t minNodes = 0);

}  // namespace mk

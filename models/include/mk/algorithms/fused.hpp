// mkernel — the fused operators: a GEMM and a collective in one schedule, overlapped tile by tile
// (docs/fused-operators.md). Generators of this family live next to the collectives' (models/src/algorithms/,
// one file per operator); engines only see Gemm, Put, ProxyPut, Reduce, Signal and Wait steps.
//
// The problem is always the whole GEMM C[m x n] = A[m x k] * B[k x n]; each operator says which piece of it every
// rank holds (fusedShards()):
//   gemm-rs  (row-parallel linear) rank r holds A's columns K_r and B's rows K_r; C = sum over ranks of
//            A_r * B_r is reduce-scattered over M: rank r ends with C's rows M_r.
//   ag-gemm  (column-parallel linear) rank r holds A's rows M_r and B's columns N_r; the A shards are
//            all-gathered while the GEMM runs: rank r ends with C[:, N_r] (all M rows).
//   gemm-ar  gemm-rs followed by the all-gather of the reduced tiles: every rank ends with all of C.
// Buffers of every schedule (per rank, element type = the spec's dtype, row-major unless said otherwise):
//   "a"  gemm-rs / gemm-ar: m x K_r (lda K_r);  ag-gemm: M_r x k (lda k)
//   "b"  gemm-rs / gemm-ar: K_r x n (ldb n), or with MatrixLayout::ColMajor n x K_r (ldb K_r);
//        ag-gemm: k x N_r (ldb N_r), or column-major N_r x k (ldb k)
//   "c"  gemm-rs: M_r x n;  gemm-ar: m x n;  ag-gemm: m x N_r (ldc N_r)
// plus scratch ("partial" and "recv" for the reduction, "gathered" for the gathered A).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/topology/topology.hpp"

namespace mk {

/// The fused operators.
enum class FusedOp : uint8_t { GemmReduceScatter, AllGatherGemm, GemmAllReduce };

const char* toString(FusedOp op) noexcept;  ///< "gemm-rs", "ag-gemm", "gemm-ar"
/// Also accepts "gemm_rs", "ag_gemm", "gemm_ar".
std::optional<FusedOp> parseFusedOp(std::string_view s) noexcept;
/// parseFusedOp, or Error(InvalidArgument) "unknown <what> '<s>' (expected gemm-rs, ag-gemm, gemm-ar)".
FusedOp requireFusedOp(std::string_view s, std::string_view what = "op");
/// Every fused operator, in a stable order.
std::vector<FusedOp> fusedOps();

/// Storage order of B (as mk-bench gemm --layout-b): row-major (k x n, n contiguous) or column-major (k
/// contiguous: an n x k row-major array, the weight of a PyTorch Linear layer).
enum class MatrixLayout : uint8_t { RowMajor, ColMajor };
const char* toString(MatrixLayout l) noexcept;  ///< "row", "col"
std::optional<MatrixLayout> parseMatrixLayout(std::string_view s) noexcept;

/// The order a rank's compute lane walks the tiles of the shards (and its send lanes the messages):
///  * OwnFirst: shard by shard, its own first, then the peers' in ring order (ag-gemm's own shard is the only one
///    present at the start);
///  * OwnLast: shard by shard, the peers' in ring order, its own last (gemm-rs's own tiles need no transfer, so
///    last they hide the last transfers);
///  * Interleaved: tile by tile, round t running tile t of its own shard and then of each peer's in ring order
///    (gemm-ar: every round completes some owners' tiles, so their all-gather starts after the first round);
///  * Auto: the one with the lowest closed form (planFused).
enum class TileOrder : uint8_t { Auto, OwnFirst, OwnLast, Interleaved };
const char* toString(TileOrder o) noexcept;  ///< "auto", "own-first", "own-last", "interleaved"
std::optional<TileOrder> parseTileOrder(std::string_view s) noexcept;

/// What to compute.
struct FusedSpec {
  FusedOp op = FusedOp::GemmReduceScatter;
  DType dtype = DType::BFloat16;  ///< A, B and C: bfloat16 (float16 on the CPU reference and the models)
  uint64_t m = 0, n = 0, k = 0;   ///< the whole GEMM: C[m x n] = A[m x k] * B[k x n]
  MatrixLayout layoutB = MatrixLayout::RowMajor;
};

/// How to shape the schedule. generate() needs every field concrete; planFused() fills the open ones.
struct FusedOptions {
  uint32_t tileRows = 0;  ///< rows of C per tile: one Gemm step, one message per peer (0: planFused's default)
  TileOrder order = TileOrder::Auto;
  /// CTAs of one rank's resident kernel that the split divides (0: planFused takes the GPU's SMs less the
  /// engine's reserve, kEngineReservedSms).
  uint32_t ctas = 0;
  /// Of those, the CTAs of all communication lanes together; the compute lane gets the rest (0: planFused
  /// takes the split with the lowest closed form). Ignored on one rank (nothing to communicate).
  uint32_t commCtas = 0;
  /// Compute lanes taking the walk's tiles in turn, the compute CTAs shared evenly: more than one keeps the SMs
  /// busy when a tile has fewer 128 x 128 output tiles than the compute lane has CTAs (ag-gemm on many ranks:
  /// a shard of m / p rows times n / p columns). 0: planFused takes 1, 2 or 4 by the lowest closed form.
  uint32_t computeLanes = 0;
};

/// SMs the GPU engine's compute-capable resident kernel leaves out of its workers: the control block's and three
/// kept free for kernels the caller's streams wait on (docs/gpu-engine.md, "Compute lanes").
inline constexpr uint32_t kEngineReservedSms = 4;

/// The piece of the GEMM a rank holds (half-open index ranges of the whole problem; see the file comment).
struct FusedShard {
  uint64_t rowBegin = 0, rows = 0;  ///< gemm-rs / gemm-ar: C rows it reduces (owns); ag-gemm: A rows it holds
  uint64_t colBegin = 0, cols = 0;  ///< ag-gemm: B and C columns; otherwise all n
  uint64_t kBegin = 0, kLen = 0;    ///< gemm-rs / gemm-ar: A columns and B rows; ag-gemm: all k
};

/// Check `spec` on `nRanks` ranks (the bad-input rules of docs/fused-operators.md): dtype 16-bit; m, n, k >= 1
/// and below 2^32; m >= nRanks; k (and for ag-gemm n) a multiple of 8 with at least 8 per rank where split; n a
/// multiple of 8. Throws Error(InvalidArgument) naming the dimension and what it must divide by, or
/// Error(Unsupported) for a dtype the GEMM engine does not take.
void validateFusedSpec(const FusedSpec& spec, uint32_t nRanks);

/// What every rank holds: rows split as evenly as possible (the first ranks one more), k (gemm-rs, gemm-ar) and
/// n (ag-gemm) in pieces of whole 8-element units (TMA rows of 16 bytes). Calls validateFusedSpec.
std::vector<FusedShard> fusedShards(const FusedSpec& spec, uint32_t nRanks);

/// Generate the schedule of `spec` on ranks placed on nodes as `nodeOf` says (any layout; Put inside a node,
/// ProxyPut across nodes). `opt` must be concrete (planFused() makes it so): tileRows >= 1, order not Auto,
/// computeLanes >= 1, ctas >= 1 and, on more than one rank, 1 <= commCtas < ctas with at least one CTA for every
/// communication lane of every rank and every compute lane. Throws Error(InvalidArgument) naming the field. The result
/// passes validate() and has cost attributes filled; Lane::ctas is the split (compute lane: ctas - commCtas).
Schedule generate(const FusedSpec& spec, const std::vector<uint32_t>& nodeOf, const FusedOptions& opt);

/// Which resource a fused op's time is bound by: the one busiest over the op (largest busy time of one lane).
enum class FusedBound : uint8_t { Tensor, NvLink, Network, Memory };
const char* toString(FusedBound b) noexcept;  ///< "tensor", "nvlink", "network", "memory"

/// The closed form of a fused schedule: total = dispatch + the longest path through its tile pipeline, and the
/// pipeline's parts (docs/fused-operators.md, "Cost model"). For equal tiles the path is the familiar
/// fill + (tiles - 1) x (the slowest stage's time per tile) + drain.
struct FusedEstimate {
  double totalUs = 0;     ///< the overlapped time
  double dispatchUs = 0;  ///< profile.dispatchUs (+ peerUserUs for gemm-ar), paid once
  /// Busy time of the busiest lane of each resource on any rank: the steady state each resource could sustain.
  double tensorUs = 0, nvlinkUs = 0, networkUs = 0, memoryUs = 0;
  FusedBound bound = FusedBound::Tensor;  ///< the largest of the four
  double boundUs = 0;                     ///< its busy time
  double fillDrainUs = 0;                 ///< totalUs - dispatchUs - boundUs: pipeline fill, drain and stalls
  uint64_t tilesPerRank = 0;              ///< Gemm steps of every rank (a tile of every shard)
  uint32_t computeCtas = 0;               ///< the compute lanes' CTAs together
  std::string formula;                    ///< the instantiated formula, for humans
};

/// Closed form of generate(spec, topo.layout(nRanks), opt) under `profile` (opt concrete), without building
/// the schedule: the generator's pipeline evaluated tile by tile under the timeline's rules (the per-lane
/// recurrence end(k) = max(end(k-1), ready(k)) + price(k)), so it equals simulateUncontended() on the schedule.
/// Throws what generate() throws, and Error(InvalidArgument) for a profile rate it needs.
FusedEstimate fusedClosedForm(const FusedSpec& spec, const FusedOptions& opt, const Topology& topo, uint32_t nRanks,
                              const Profile& profile);

/// A fused op with everything decided.
struct FusedPlan {
  FusedSpec spec;
  FusedOptions opt;           ///< concrete
  bool tileDefault = false;   ///< tileRows was 0: one wave of the kernel's CTAs per Gemm step (fusedDefaultTileRows)
  bool orderByModel = false;  ///< order was Auto: the lower closed form
  bool ctasDefault = false;   ///< ctas was 0: the GPU's SMs less kEngineReservedSms
  bool splitByModel = false;  ///< commCtas was 0: the lowest closed form over every feasible split
  bool lanesByModel = false;  ///< computeLanes was 0: the lowest closed form over 1, 2 and 4
  FusedEstimate estimate;     ///< the closed form of the plan
};

/// Default tile height: the fewest rows (a multiple of 128, the GEMM engine's tile) whose Gemm step holds at
/// least one wave of `ctas` 128 x 128 output tiles, but not more than the largest shard's rows.
uint32_t fusedDefaultTileRows(const FusedSpec& spec, uint32_t nRanks, uint32_t ctas);

/// Decide what `opt` leaves open, as the GPU engine would for a submitted fused op: ctas (the SMs of
/// profile.sms, else topo.node.sms, less kEngineReservedSms), tileRows (fusedDefaultTileRows), and order,
/// computeLanes and commCtas together by the lowest fusedClosedForm (ties: own-first before own-last before
/// interleaved, then fewer compute lanes, then fewer communication CTAs). Throws
/// Error(InvalidArgument) for ctas above the GPU's SMs, plus what validateFusedSpec and generate() throw.
FusedPlan planFused(const FusedSpec& spec, FusedOptions opt, const Topology& topo, uint32_t nRanks,
                    const Profile& profile);

/// The unfused baseline of the same op, priced by the same profile: the GEMM of one rank on all of its SMs
/// (gemmTflops) and the collective alone with our own generator that "auto" picks (reduce-scatter, all-gather
/// or all-reduce of the same bytes; closedForm()).
struct LayeredEstimate {
  double gemmUs = 0;        ///< the largest rank's GEMM at gemmTflops
  double collectiveUs = 0;  ///< the collective alone (0 on one rank)
  std::string collective;   ///< "reducescatter direct", ...
  double totalUs() const noexcept { return gemmUs + collectiveUs; }
  /// The physical bound of any schedule: max(GEMM alone, collective alone).
  double boundUs() const noexcept { return gemmUs > collectiveUs ? gemmUs : collectiveUs; }
};
LayeredEstimate layeredEstimate(const FusedSpec& spec, const Topology& topo, uint32_t nRanks, const Profile& profile);

/// Useful work of the op: 2 m n k.
double fusedFlops(const FusedSpec& spec) noexcept;

}  // namespace mk

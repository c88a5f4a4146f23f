// mkernel — the step-kind table: one entry per kind of Schedule IR step.
//
// An entry says what a kind is (its JSON name, which Step fields it uses, what it does to data and to
// other lanes); code that only needs such a fact asks kindInfo(kind) instead of naming kinds. Each concern
// that treats kinds differently has one dispatch (a switch with no default, so -Wswitch lists every
// handler a new kind needs): JSON (io.cpp), packed form (pack.cpp), checks (validate_steps.cpp),
// CPU execution (exec/executor.cpp), price (cost/step_cost.cpp), SimGrid replay (sim/src/replay.cpp) and
// lowering (impl/src/lowering/lowering.cpp). docs/schedule-format.md "Adding a step kind" is the checklist.
//
// The enumerator's value is the packed code (pack.hpp's PackedStep::kind) and the device kernel's: never
// renumber, append.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace mk {

/// The step vocabulary. Engines know these; only generators know algorithms.
enum class StepKind : uint8_t {
  Copy = 0,      ///< dst <- a (same rank, or an NVLink peer's memory as source or destination)
  Reduce = 1,    ///< dst <- op(a, b), element-wise, computed in float and rounded once to dst's dtype
  Put = 2,       ///< dst (an NVLink peer's buffer) <- a (local), then optionally signal `flag`
  ProxyPut = 3,  ///< dst (a rank on another node) <- a through the proxy FIFO, optional remote signal
  Signal = 4,    ///< flag(rank, id) += value (release: everything this lane wrote before is visible)
  Wait = 5,      ///< block until own flag(id) >= value within this op instance (acquire)
  Gemm = 6,      ///< C tile (dst) [+]= A tile (a) x B tile (b); shape in Schedule::gemms[aux]
  Barrier = 7,   ///< every rank reaches barrier `aux` before any rank leaves it
  /// `count` Gemms in one step (MoE's experts): group h on gemms[aux + h], its A, B and C blocks stacked after
  /// the previous groups' (forEachGemm in schedule.hpp)
  GroupedGemm = 8,
  /// MoE routing layout (DeepEP's get_dispatch_layout): from the router's int32 expert ids (a: tokens x topk),
  /// write the int32 layout dst: a count per bucket, then each bucket's token list (route.hpp, routeShape); the
  /// buckets are the experts, their nodes or the executing node's experts (RouteBuckets)
  Route = 9,
  /// dst rows <- a rows at the int32 row indices in b (a route's token list): count / row rows of `row` elements
  Gather = 10,
  /// attention of a block of queries (a) against a block of keys and values (b), one log-sum-exp row per (batch,
  /// query, head) into dst; sizes, layout and mask in Schedule::attentions[aux] (attention.hpp)
  Attention = 11,
  /// MoE combine (the mirror of a dispatch): dst row t <- sum over the token's topk slots k of weight[t][k] times
  /// the expert output row that came back for (t, k), in float32; across nodes a relay's partial sums over its
  /// node's experts, or the tokens' rank's sum of its node's rows and the other nodes' partial sums (route.hpp,
  /// combineShape)
  Combine = 12,
  /// the backward of an attention step: from Q and dO (a), K and V (b) and the forward's rows (in dst's buffer), add
  /// dK and dV (dst) and dQ (in dst's buffer); shape in Schedule::attentions[aux] (attention.hpp)
  AttentionGrad = 13,
};

/// Which Step fields a kind uses (StepKindInfo::fields); the others are ignored and written as zero.
enum StepFieldBits : uint16_t {
  kFieldDst = 1u << 0,     ///< dst operand
  kFieldA = 1u << 1,       ///< a operand
  kFieldB = 1u << 2,       ///< b operand
  kFieldCount = 1u << 3,   ///< count (elements on every operand)
  kFieldOp = 1u << 4,      ///< op (RedOp)
  kFieldFlag = 1u << 5,    ///< flag + value, always
  kFieldSignal = 1u << 6,  ///< flag + value when kStepSignal is set (the optional signal of a put)
  kFieldAux = 1u << 7,     ///< aux (what it names: StepKindInfo::auxName)
  kFieldExtent = 1u << 8,  ///< extent: count may be a runtime extent's (extent.hpp)
  kFieldValue = 1u << 9,   ///< value without a flag: a size the kind needs (route.hpp: experts, source rows)
};

/// What a step's elements look like on its operands (StepKindInfo::extent).
enum class StepExtent : uint8_t {
  None = 0,  ///< no data operands (synchronisation)
  Flat = 1,  ///< `count` contiguous elements on each operand it uses
  Tile = 2,  ///< a Gemm tile: rows x columns with a leading dimension, from Schedule::gemms[aux]
  /// elements per operand from the step's sizes (route, gather, combine: indexedElements in route.hpp); what a
  /// gather or a combine reads of `a` depends on its indices, so its whole source region counts
  Indexed = 3,
  /// an attention block: per batch, rows of Q, K, V and output with their leading dimensions (attention.hpp)
  Attention = 4,
};

/// One row of the table: everything about a kind that is a fact rather than a behaviour.
struct StepKindInfo {
  StepKind kind;
  const char* name;     ///< JSON, CLI and trace spelling (docs/schedule-format.md); never rename
  const char* alias;    ///< another accepted JSON spelling, or nullptr
  uint16_t fields;      ///< StepFieldBits
  StepExtent extent;    ///< shape of its data operands
  const char* auxName;  ///< JSON key of aux ("gemm", "barrier", "row": lse-merge's row width, "topk", "attention")
  bool movesData;       ///< copies elements from a to dst (possibly across ranks or nodes)
  bool computes;        ///< computes dst from its operands (arithmetic, priced by FLOPs or bytes)
  bool waits;           ///< may block on other lanes (flag threshold or barrier)
  bool peerWrite;       ///< writes another rank's memory (dst is remote by definition)
  bool remote;          ///< crosses nodes through the proxy FIFO
  bool protocol;        ///< may carry the LL / LL128 protocol bits
  bool gpu;             ///< the GPU engine runs it; its lowering refuses the others (ErrorCode::Unsupported)
};

// clang-format off
/// The table, indexed by the kind's value.
inline constexpr StepKindInfo kStepKinds[] = {
  // kind              name        alias        fields                                                extent            auxName    moves  comp   waits  peerW  remote proto  gpu
  {StepKind::Copy,     "copy",     nullptr,     kFieldDst | kFieldA | kFieldCount | kFieldExtent,     StepExtent::Flat, nullptr,   true,  false, false, false, false, false, true},
  {StepKind::Reduce,   "reduce",   nullptr,     kFieldDst | kFieldA | kFieldB | kFieldCount | kFieldOp | kFieldExtent | kFieldAux, StepExtent::Flat, "row", false, true,  false, false, false, false, true},
  {StepKind::Put,      "put",      nullptr,     kFieldDst | kFieldA | kFieldCount | kFieldSignal | kFieldExtent, StepExtent::Flat, nullptr,   true,  false, false, true,  false, true,  true},
  {StepKind::ProxyPut, "proxyput", "proxy-put", kFieldDst | kFieldA | kFieldCount | kFieldSignal | kFieldExtent, StepExtent::Flat, nullptr,   true,  false, false, true,  true,  true,  true},
  {StepKind::Signal,   "signal",   nullptr,     kFieldFlag,                                           StepExtent::None, nullptr,   false, false, false, false, false, false, true},
  {StepKind::Wait,     "wait",     nullptr,     kFieldFlag,                                           StepExtent::None, nullptr,   false, false, true,  false, false, false, true},
  {StepKind::Gemm,     "gemm",     nullptr,     kFieldDst | kFieldA | kFieldB | kFieldAux,            StepExtent::Tile, "gemm",    false, true,  false, false, false, false, true},
  {StepKind::Barrier,  "barrier",  nullptr,     kFieldAux,                                            StepExtent::None, "barrier", false, false, true,  false, false, false, true},
  {StepKind::GroupedGemm, "grouped-gemm", nullptr, kFieldDst | kFieldA | kFieldB | kFieldCount | kFieldAux, StepExtent::Tile, "gemm", false, true, false, false, false, false, true},
  {StepKind::Route,    "route",    nullptr,     kFieldDst | kFieldA | kFieldCount | kFieldAux | kFieldValue | kFieldExtent, StepExtent::Indexed, "topk", false, true, false, false, false, false, true},
  {StepKind::Gather,   "gather",   nullptr,     kFieldDst | kFieldA | kFieldB | kFieldCount | kFieldAux | kFieldValue | kFieldExtent, StepExtent::Indexed, "row", true, false, false, false, false, false, true},
  {StepKind::Attention, "attention", nullptr,  kFieldDst | kFieldA | kFieldB | kFieldAux,            StepExtent::Attention, "attention", false, true, false, false, false, false, true},
  {StepKind::Combine,  "combine",  nullptr,     kFieldDst | kFieldA | kFieldB | kFieldCount | kFieldAux | kFieldValue | kFieldExtent, StepExtent::Indexed, "topk", false, true, false, false, false, false, true},
  {StepKind::AttentionGrad, "attention-grad", nullptr, kFieldDst | kFieldA | kFieldB | kFieldAux,  StepExtent::Attention, "attention", false, true, false, false, false, false, false},
};
// clang-format on

/// Number of step kinds; a packed code at or above it is unknown.
inline constexpr std::size_t kStepKindCount = sizeof(kStepKinds) / sizeof(kStepKinds[0]);

namespace detail {
constexpr bool stepKindsInOrder() noexcept {
  for (std::size_t i = 0; i < kStepKindCount; ++i)
    if (static_cast<std::size_t>(kStepKinds[i].kind) != i) return false;
  return true;
}
constexpr bool flatKindsUseDstAndA() noexcept {
  for (const auto& k : kStepKinds)
    if (k.extent == StepExtent::Flat && (k.fields & (kFieldDst | kFieldA)) != (kFieldDst | kFieldA)) return false;
  return true;
}
}  // namespace detail
static_assert(detail::stepKindsInOrder(), "kStepKinds must list every StepKind in enumerator order");
static_assert(detail::flatKindsUseDstAndA(), "a Flat kind writes dst from a (and b): it must use both");

/// Whether `code` (a packed or cast value) names a kind.
constexpr bool isStepKind(uint8_t code) noexcept { return code < kStepKindCount; }

/// What kindInfo answers for a value that is no kind (cast from bad input): named "?", using no field.
inline constexpr StepKindInfo kUnknownStepKind{
    StepKind{0xFF}, "?", nullptr, 0, StepExtent::None, nullptr, false, false, false, false, false, false, false};

/// The table entry of `kind`, or kUnknownStepKind for a value that is no kind.
constexpr const StepKindInfo& kindInfo(StepKind kind) noexcept {
  return isStepKind(static_cast<uint8_t>(kind)) ? kStepKinds[static_cast<std::size_t>(kind)] : kUnknownStepKind;
}

/// Whether a step of `kind` is priced by its FLOPs on the tensor cores of its lane's SMs (Gemm and GroupedGemm
/// tiles, attention blocks forward and backward): the work of a compute lane.
constexpr bool pricedByFlops(StepKind kind) noexcept {
  return kindInfo(kind).extent == StepExtent::Tile || kindInfo(kind).extent == StepExtent::Attention;
}

/// The stable name of `kind` ("copy", "proxyput", ...), "?" for a value cast from bad input.
constexpr const char* toString(StepKind kind) noexcept { return kindInfo(kind).name; }

/// The kind called `s` (its name or alias), case-sensitive.
constexpr std::optional<StepKind> parseStepKind(std::string_view s) noexcept {
  for (const StepKindInfo& k : kStepKinds)
    if (s == k.name || (k.alias != nullptr && s == k.alias)) return k.kind;
  return std::nullopt;
}

}  // namespace mk

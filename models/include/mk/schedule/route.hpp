// mkernel — routing as data: the sizes and operand regions of the route and gather steps (a MoE dispatch).
//
// A mixture-of-experts router picks `topk` experts per token; which tokens go where is known only when the layer
// runs. DeepEP dispatches in three phases, layout -> notify -> dispatch; the IR spells each with data:
//  * layout: a route step reads the router's int32 expert ids (tokens x topk on the executing rank) and writes an
//    int32 layout: a count per global expert, then expert e's token list at experts + e x capacity: the indices of
//    the tokens routed to e in ascending order, `capacity` entries per expert, unused entries -1. An id outside
//    [0, experts), or an expert given more than `capacity` tokens, is refused before anything is written, naming
//    the rank, the token, k and the id (or the expert, its count and the capacity);
//  * notify: a plain put of the counts into the receiving rank's int32 count buffer, with a signal;
//  * dispatch: runtime extents whose source is a count (extent.hpp) size the steps that move and multiply the
//    tokens, read when each starts; a gather step packs an expert's tokens into a contiguous block first.
// Offsets stay those of the bound (extent.hpp), so each expert's list has a fixed stride, `capacity`, instead of
// DeepEP's prefix-summed packing: a packed list would need offsets known only at run time, which the IR lacks.
//
// Across nodes (DeepEP's per-node deduplication) a route may fill other buckets than the experts (RouteBuckets):
// the nodes (a token goes to node n's list once if any of its experts lives on n), or only the experts of the
// executing rank's node (a relay routing the tokens it received). Experts are placed contiguously, experts /
// nRanks per rank (expertRank), and ranks on nodes by the schedule's nodeOf: no table to fill. A route may name a
// runtime extent: it then reads count / bound x value ids (the tokens that arrived), its layout keeps its size.
#pragma once

#include <cstdint>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk {

/// Which lists a Route step fills (Step::flags: kStepRouteNodes, kStepRouteOwnNode; at most one).
enum class RouteBuckets : uint8_t {
  Experts,  ///< list e: the tokens naming expert e, once per id naming it
  Nodes,    ///< list n: the tokens naming any expert that lives on node n (nodeOf of expertRank), each once
  OwnNode,  ///< list e for the experts on the executing rank's node as Experts; ids of other experts are skipped
};

/// The buckets that Step::flags name (a route's and a combine's): kStepRouteNodes, kStepRouteOwnNode or neither.
constexpr RouteBuckets stepBuckets(uint8_t flags) noexcept {
  return (flags & kStepRouteNodes)     ? RouteBuckets::Nodes
         : (flags & kStepRouteOwnNode) ? RouteBuckets::OwnNode
                                       : RouteBuckets::Experts;
}

/// The rank expert `expert` of `experts` lives on: experts / nRanks per rank, in order (nRanks divides experts).
constexpr uint32_t expertRank(uint64_t expert, uint64_t experts, uint32_t nRanks) noexcept {
  return static_cast<uint32_t>(expert / (experts / nRanks));
}

/// The sizes of a Route step. In the Step: count = tokens x topk ids read from a, aux = topk, value = experts (low
/// 32 bits) and capacity (high 32 bits): routeValue().
struct RouteShape {
  uint64_t tokens = 0;    ///< rows of the id matrix: count / topk
  uint32_t topk = 0;      ///< experts per token (ids per row); at most `experts`
  uint32_t experts = 0;   ///< global experts: ids lie in [0, experts)
  uint32_t capacity = 0;  ///< entries of each expert's token list: the most tokens one expert may get
  RouteBuckets buckets = RouteBuckets::Experts;  ///< what the lists stand for; experts lists in every case

  /// Elements of the layout the step writes: a count per expert, then each expert's token list.
  uint64_t layoutElements() const noexcept { return uint64_t{experts} * (uint64_t{capacity} + 1); }
};

/// Step::value of a Route step over `experts` experts with token lists of `capacity` entries.
constexpr uint64_t routeValue(uint32_t experts, uint32_t capacity) noexcept {
  return (uint64_t{capacity} << 32) | experts;
}

/// The sizes a Route step stands for (its count, aux and value; the fields are not checked here).
inline RouteShape routeShape(const Step& st) noexcept {
  RouteShape r;
  r.topk = st.aux;
  r.tokens = st.aux == 0 ? 0 : st.count / st.aux;
  r.experts = static_cast<uint32_t>(st.value & 0xFFFFFFFFu);
  r.capacity = static_cast<uint32_t>(st.value >> 32);
  r.buckets = stepBuckets(st.flags);
  return r;
}

/// The list a Route of shape `rs`, run by `rank`, files expert `expert` under, or -1 when it skips it (OwnNode, an
/// expert off the rank's node). `nodeOf` is the schedule's placement; the validator checks that nRanks divides
/// experts and that every node id is below experts when the buckets are not the experts.
inline int64_t routeBucket(const RouteShape& rs, uint32_t expert, uint32_t rank,
                           const std::vector<uint32_t>& nodeOf) noexcept {
  if (rs.buckets == RouteBuckets::Experts) return expert;
  const uint32_t node = nodeOf[expertRank(expert, rs.experts, static_cast<uint32_t>(nodeOf.size()))];
  if (rs.buckets == RouteBuckets::Nodes) return node;
  return node == nodeOf[rank] ? int64_t{expert} : -1;
}

/// Why Route (or Combine) step `st` of `s` cannot file ids under its lists (read its blocks by them), or nullptr: both
/// bucket bits set, or lists other than the experts without experts a multiple of nRanks (expertRank) or with a node id
/// at or above experts (one list per expert is all the layout holds). The validator and the CPU executor ask this.
inline const char* routeBucketsProblem(const Schedule& s, const Step& st) noexcept {
  if ((st.flags & kStepRouteNodes) && (st.flags & kStepRouteOwnNode))
    return "buckets: kStepRouteNodes and kStepRouteOwnNode are both set (a route fills, a combine reads, one kind of "
           "list)";
  const RouteShape rs = routeShape(st);
  if (rs.buckets == RouteBuckets::Experts) return nullptr;
  if (s.nRanks == 0 || s.nodeOf.size() != s.nRanks || rs.experts % s.nRanks != 0)
    return "buckets: lists per node place experts / nRanks experts on each rank: experts must be a multiple of "
           "nRanks";
  for (const uint32_t node : s.nodeOf)
    if (node >= rs.experts) return "buckets: a node id is not below experts (the layout holds one list per expert)";
  return nullptr;
}

/// The sizes of a Combine step (a MoE combine, the mirror of the dispatch). In the Step: count = tokens x row
/// elements of dst, aux = topk, value = experts (low 32 bits) and row (high 32 bits): combineValue(). Operands, all
/// on the executing rank: dst float32 tokens x row (the combined tokens); b int32 tokens x topk (the router's ids);
/// a float32: the router's weights (tokens x topk), then per expert j a block of `tokens` rows of `row` elements,
/// row i the expert's output for the i-th (token, k) naming j in row-major order of the ids, as a route lists them
/// (its list position). dst row t = sum over k of weight[t][k] x block ids[t][k], row (list position of (t, k)),
/// summed in double and rounded once to float32; every row of dst is written (topk >= 1 gives every token a slot).
/// An id outside [0, experts), or a list position at or past `tokens` (an expert named more than tokens times), is
/// refused before anything is written. Block rows past an expert's count are never read.
///
/// Across nodes (the mirror of a per-node deduplicated dispatch) the flags pick other buckets, as a route's do
/// (RouteBuckets; expertRank and the schedule's nodeOf place the experts):
///  * OwnNode (a relay's partial sums): slots naming an expert off the executing rank's node are skipped (neither
///    their weight nor a row is read); list positions count the kept slots, as an OwnNode route lists them;
///  * Nodes (the final combine of the tokens' rank): slots naming an expert of the executing rank's node as above;
///    the slots of token t naming experts of another node n add, once per (t, n) and unweighted, row p of the block
///    of n's lowest expert (the block that expert fills otherwise), p = t's position in node n's list (the tokens
///    naming an expert on n, in order, as a Nodes route lists them): the weighted sum node n returned for t.
/// A Combine may name a runtime extent (extent.hpp): it then combines the first count / bound x value tokens (the
/// rows that arrived) and writes only their rows; the blocks keep the bound's `tokens` rows.
struct CombineShape {
  uint64_t tokens = 0;   ///< rows of dst and of the ids at the bound, rows of every block: count / row
  uint32_t topk = 0;     ///< slots per token
  uint32_t experts = 0;  ///< blocks of a after the weights: ids lie in [0, experts)
  uint32_t row = 0;      ///< elements of a row (the hidden size)
  RouteBuckets buckets = RouteBuckets::Experts;  ///< which slots read which blocks (kStepRouteOwnNode, kStepRouteNodes)
};

/// Step::value of a Combine step over `experts` expert blocks of rows of `row` elements.
constexpr uint64_t combineValue(uint32_t experts, uint32_t row) noexcept { return (uint64_t{row} << 32) | experts; }

/// The sizes a Combine step stands for (its count, aux, value and flags; the fields are not checked here).
inline CombineShape combineShape(const Step& st) noexcept {
  CombineShape c;
  c.topk = st.aux;
  c.experts = static_cast<uint32_t>(st.value & 0xFFFFFFFFu);
  c.row = static_cast<uint32_t>(st.value >> 32);
  c.tokens = c.row == 0 ? 0 : st.count / c.row;
  c.buckets = stepBuckets(st.flags);
  return c;
}

/// Elements a step of StepExtent::Indexed (route, gather, combine) touches on each operand at its bound, 0 where it has
/// none: route reads count ids from a and writes the layout to dst; gather (count = rows x row, aux = row, value =
/// the rows of a its indices may name) writes count elements to dst, reads count / row indices from b and may read
/// any of the value x row elements of a; combine (CombineShape) writes count elements to dst, reads tokens x topk
/// ids from b and may read the weights and every expert block of a. Products saturate, so a hostile size reads as out
/// of range.
struct IndexedElements {
  uint64_t dst = 0, a = 0, b = 0;
};

inline IndexedElements indexedElements(const Step& st) noexcept {
  IndexedElements e;
  if (st.kind == StepKind::Route) {
    e.dst = routeShape(st).layoutElements();
    e.a = st.count;
  } else if (st.kind == StepKind::Gather && st.aux > 0) {
    e.dst = st.count;
    e.b = st.count / st.aux;
    if (__builtin_mul_overflow(st.value, uint64_t{st.aux}, &e.a)) e.a = ~uint64_t{0};
  } else if (st.kind == StepKind::Combine) {  // a: the weights, then experts blocks of tokens x row
    const CombineShape c = combineShape(st);
    e.dst = st.count;
    uint64_t rows = 0, slots = 0;
    if (__builtin_mul_overflow(c.tokens, uint64_t{c.topk}, &slots)) slots = ~uint64_t{0};
    e.b = slots;
    if (__builtin_mul_overflow(uint64_t{c.experts}, st.count, &rows) || __builtin_add_overflow(rows, slots, &e.a))
      e.a = ~uint64_t{0};
  }
  return e;
}

}  // namespace mk

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
#pragma once

#include <cstdint>

#include "mk/schedule/schedule.hpp"

namespace mk {

/// The sizes of a Route step. In the Step: count = tokens x topk ids read from a, aux = topk, value = experts (low
/// 32 bits) and capacity (high 32 bits): routeValue().
struct RouteShape {
  uint64_t tokens = 0;    ///< rows of the id matrix: count / topk
  uint32_t topk = 0;      ///< experts per token (ids per row); at most `experts`
  uint32_t experts = 0;   ///< global experts: ids lie in [0, experts)
  uint32_t capacity = 0;  ///< entries of each expert's token list: the most tokens one expert may get

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
  return r;
}

/// Elements a step of StepExtent::Indexed (route, gather) touches on each operand at its bound, 0 where it has
/// none: route reads count ids from a and writes the layout to dst; gather (count = rows x row, aux = row, value =
/// the rows of a its indices may name) writes count elements to dst, reads count / row indices from b and may read
/// any of the value x row elements of a. Products saturate, so a hostile size reads as out of range.
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
  }
  return e;
}

}  // namespace mk

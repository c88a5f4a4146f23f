// mkernel — internal: small helpers the operator generators that build a Schedule directly share
// (moe_dispatch_gemm.cpp, moe_ffn.cpp, ring_attention.cpp, ring_attention_backward.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk::gen {

/// The product of `factors`, or kMaxElements + 1 when it passes kMaxElements (so a check against the limit sees it).
inline uint64_t elements(std::initializer_list<uint64_t> factors) {
  uint64_t n = 1;
  for (uint64_t f : factors)
    if (__builtin_mul_overflow(n, f, &n) || n > kMaxElements) return kMaxElements + 1;
  return n;
}

/// The name of the first size in `sizes` that is 0, or nullptr when none is.
inline const char* firstZero(std::initializer_list<std::pair<const char*, uint64_t>> sizes) {
  for (const auto& [name, v] : sizes)
    if (v == 0) return name;
  return nullptr;
}

/// A Signal or Wait step on flag `id` of `rank` with `value`.
inline Step flagStep(StepKind kind, uint32_t rank, uint32_t id, uint64_t value) {
  Step st;
  st.kind = kind;
  st.flag = FlagRef{rank, id};
  st.value = value;
  return st;
}

/// Rank `r` raises flag `id` of `target` by `value`: a Signal step inside its node; across nodes a signalling proxyput
/// of 0 elements (the proxy delivers the flag: a Signal step reaches only NVLink peers), its operands element 0 of
/// `buffer` on both ranks.
inline Step signalStep(const std::vector<uint32_t>& nodeOf, uint32_t r, uint32_t target, uint32_t id, uint64_t value,
                       uint16_t buffer) {
  Step st = flagStep(StepKind::Signal, target, id, value);
  if (nodeOf[target] == nodeOf[r]) return st;
  st.kind = StepKind::ProxyPut;
  st.flags = kStepSignal;
  st.dst = bufRef(target, buffer, 0);
  st.a = bufRef(r, buffer, 0);
  return st;
}

/// A copy (to the executing rank `r`), put (inside its node) or proxyput (across nodes) of `count` elements, sized by
/// `extent` when it is not kNoExtent, signalling flag `flag` of the receiver +1 unless it is the executing rank.
inline Step move(const std::vector<uint32_t>& nodeOf, uint32_t r, BufRef dst, BufRef a, uint64_t count, uint32_t extent,
                 uint32_t flag) {
  Step st;
  st.kind = dst.rank == r ? StepKind::Copy : nodeOf[dst.rank] == nodeOf[r] ? StepKind::Put : StepKind::ProxyPut;
  st.count = count;
  st.extent = extent;
  st.dst = dst;
  st.a = a;
  if (dst.rank != r) {
    st.flags = kStepSignal;
    st.flag = FlagRef{dst.rank, flag};
    st.value = 1;
  }
  return st;
}

/// Index of `sh` in s.attentions, appending it when it is new. Blocks that differ only in where they sit (sizes, mask
/// positions and the backward's offsets) get their own entry; every other field is the generator's spec's, the same
/// for all, so those are the fields compared.
inline uint32_t attentionShapeIndex(Schedule& s, const AttentionShape& sh) {
  for (std::size_t i = 0; i < s.attentions.size(); ++i) {
    const AttentionShape& o = s.attentions[i];
    if (o.sq == sh.sq && o.skv == sh.skv && o.causal == sh.causal && o.qPos == sh.qPos && o.kvPos == sh.kvPos &&
        o.doOffset == sh.doOffset && o.rowsAt == sh.rowsAt && o.dqAt == sh.dqAt)
      return static_cast<uint32_t>(i);
  }
  s.attentions.push_back(sh);
  return static_cast<uint32_t>(s.attentions.size() - 1);
}

}  // namespace mk::gen

// mkernel — the cost attributes of a schedule's steps (Step::bytes, flops, link), at the runtime extents' expected
// or given values (pack.hpp declares fillCostAttributes: readers and unpack() call it).
#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "mk/schedule/pack.hpp"
#include "mk/schedule/route.hpp"

namespace mk {
namespace {

/// fillCostAttributes with the share of its bound each (rank, extent) is priced at.
template <class Share>
void fillCostAttributesAt(Schedule& s, Share&& share) {
  const std::size_t nBuf = s.buffers.size();
  auto dtypeOf = [&](const BufRef& r, std::size_t& size) {
    if (r.buffer >= nBuf) return false;
    size = dtypeSize(s.buffers[r.buffer].dtype);
    return true;
  };
  const std::size_t nRanks = std::min<std::size_t>(s.lanes.size(), s.nodeOf.size());
  for (std::size_t r = 0; r < s.lanes.size(); ++r) {
    const auto rank = static_cast<uint32_t>(r);
    for (Lane& lane : s.lanes[r]) {
      for (Step& st : lane.steps) {
        st.bytes = 0;
        st.flops = 0;
        std::size_t esz = 0;
        // `full` (at the bound of `extent`) at this rank's priced share of it, rounded to a whole number.
        auto scaled = [&](uint64_t full, uint32_t extent) -> uint64_t {
          if (extent == kNoExtent || extent >= s.extents.size()) return full;
          return static_cast<uint64_t>(std::llround(static_cast<double>(full) * share(rank, extent)));
        };
        // A copy/reduce is as slow as its farthest operand; out-of-range ranks contribute nothing.
        auto farthest = [&](std::initializer_list<const BufRef*> refs) {
          LinkClass worst = LinkClass::Local;
          for (const BufRef* ref : refs) {
            const LinkClass l = r < nRanks ? linkBetween(s, rank, ref->rank) : LinkClass::None;
            if (static_cast<uint8_t>(l) > static_cast<uint8_t>(worst)) worst = l;
          }
          return worst;
        };
        switch (st.kind) {
          case StepKind::Copy:
            st.link = farthest({&st.dst, &st.a});
            if (dtypeOf(st.dst, esz)) st.bytes = scaled(st.count * esz, st.extent);
            break;
          case StepKind::Reduce:
            st.link = farthest({&st.dst, &st.a, &st.b});
            if (dtypeOf(st.dst, esz)) st.bytes = scaled(st.count * esz, st.extent);
            st.flops = static_cast<double>(scaled(st.count, st.extent));
            break;
          case StepKind::Put:
            st.link = LinkClass::NVLink;
            if (dtypeOf(st.dst, esz)) st.bytes = scaled(st.count * esz, st.extent);
            break;
          case StepKind::ProxyPut:
            st.link = LinkClass::Network;
            if (dtypeOf(st.dst, esz)) st.bytes = scaled(st.count * esz, st.extent);
            break;
          case StepKind::Signal:
            st.link = r < nRanks ? linkBetween(s, rank, st.flag.rank) : LinkClass::None;
            st.bytes = 8;
            break;
          case StepKind::Gemm:
          case StepKind::GroupedGemm: {
            st.link = LinkClass::Local;
            std::size_t aSize = 0, cSize = 0;
            if (!dtypeOf(st.a, aSize) || !dtypeOf(st.dst, cSize)) break;
            forEachGemm(s.gemms, st, [&](const Step& one) {
              if (one.aux >= s.gemms.size()) return;
              const GemmShape& g = s.gemms[one.aux];
              const uint64_t m = scaled(g.m, g.extent), n = g.n, k = g.k;
              st.bytes += (m * k + k * n) * aSize + m * gemmOutCols(g, one.flags) * cSize;
              st.flops += 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
            });
            break;
          }
          case StepKind::Route: {  // reads the ids, writes the layout: memory traffic, no arithmetic worth pricing
            st.link = farthest({&st.dst, &st.a});
            std::size_t aSize = 0;
            if (dtypeOf(st.a, aSize) && dtypeOf(st.dst, esz))
              st.bytes = scaled(st.count * aSize, st.extent) + routeShape(st).layoutElements() * esz;
            break;
          }
          case StepKind::Gather: {  // the rows it writes and the indices it reads
            st.link = farthest({&st.dst, &st.a, &st.b});
            std::size_t bSize = 0;
            if (dtypeOf(st.dst, esz) && dtypeOf(st.b, bSize) && st.aux > 0)
              st.bytes = scaled(st.count * esz, st.extent) + scaled(st.count / st.aux, st.extent) * bSize;
            break;
          }
          // reads the weights, the ids and topk rows per token, writes a row per token; the tokens at the runtime
          // extent's expected value, and topk rows a token however its slots fall on the nodes (an upper bound for
          // the buckets per node, whose slots of other nodes read fewer rows or none)
          case StepKind::Combine: {
            st.link = farthest({&st.dst, &st.a, &st.b});
            const CombineShape c = combineShape(st);
            std::size_t bSize = 0;
            if (dtypeOf(st.dst, esz) && dtypeOf(st.b, bSize)) {
              const uint64_t slots = scaled(c.tokens * c.topk, st.extent);
              st.bytes = (scaled(st.count, st.extent) + slots * c.row + slots) * esz + slots * bSize;
              st.flops = 2.0 * static_cast<double>(slots) * static_cast<double>(c.row);
            }
            break;
          }
          case StepKind::Attention: {  // reads Q, K and V once, writes its rows; priced by its unmasked pairs
            st.link = farthest({&st.dst, &st.a, &st.b});
            std::size_t inSize = 0;
            if (st.aux >= s.attentions.size() || !dtypeOf(st.a, inSize) || !dtypeOf(st.dst, esz)) break;
            const AttentionShape& sh = s.attentions[st.aux];
            const uint64_t rows = uint64_t{sh.batch} * sh.sq;
            const uint64_t kvRows = uint64_t{sh.batch} * sh.skv * 2;
            st.bytes =
                (rows * sh.qHeads + kvRows * sh.kvHeads) * sh.headDim * inSize + rows * sh.qHeads * sh.outRow() * esz;
            st.flops = attentionFlops(sh);
            break;
          }
          case StepKind::AttentionGrad: {  // reads Q, dO, K, V and the forward's rows, adds into dQ, dK and dV
            st.link = farthest({&st.dst, &st.a, &st.b});
            std::size_t inSize = 0;
            if (st.aux >= s.attentions.size() || !dtypeOf(st.a, inSize) || !dtypeOf(st.dst, esz)) break;
            const AttentionShape& sh = s.attentions[st.aux];
            const uint64_t qElems = uint64_t{sh.batch} * sh.sq * sh.qHeads * sh.headDim;
            const uint64_t kvElems = uint64_t{sh.batch} * sh.skv * 2 * sh.kvHeads * sh.headDim;
            const uint64_t rowElems = uint64_t{sh.batch} * sh.sq * sh.qHeads * sh.outRow();
            // Q and dO, K and V read in their dtype; the rows read, dQ, dK and dV read and written in float32.
            st.bytes = (2 * qElems + kvElems) * inSize + (rowElems + 2 * qElems + 2 * kvElems) * esz;
            st.flops = attentionGradFlops(sh);
            break;
          }
          case StepKind::Wait:
          case StepKind::Barrier: st.link = LinkClass::None; break;
        }
      }
    }
  }
}

}  // namespace

void fillCostAttributes(Schedule& s) {
  fillCostAttributesAt(
      s, [&](uint32_t, uint32_t e) { return s.extents[e].expected / static_cast<double>(s.extents[e].bound); });
}

void fillCostAttributes(Schedule& s, const ExtentValues& given) {
  checkExtentValues(s, given);
  fillCostAttributesAt(s, [&](uint32_t rank, uint32_t e) {
    return static_cast<double>(extentValue(s, given, rank, e)) / static_cast<double>(s.extents[e].bound);
  });
}

}  // namespace mk

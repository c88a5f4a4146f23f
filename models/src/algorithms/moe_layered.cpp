// mkernel — moe-ffn as a framework runs it without fusion (mk/algorithms/moe.hpp, generateMoeFfnLayered): the fused
// schedule's own communication cut into two ops around the expert GEMMs, which the caller runs as standalone
// kernels between them. The cut is made on the generated moe-ffn, so the baseline moves exactly the fused op's
// bytes with the same steps; only the overlap is gone.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "mk/algorithms/moe.hpp"
#include "mk/error.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/schedule/step_kind.hpp"

namespace mk {
namespace {

uint16_t bufferOf(const Schedule& s, const char* name) {
  const int b = s.bufferIndex(name);
  if (b < 0)
    throw Error(ErrorCode::Internal, std::string("moe-ffn layered: the schedule has no buffer '") + name + "'");
  return static_cast<uint16_t>(b);
}

bool hasKind(const Lane& lane, StepKind kind) {
  return std::any_of(lane.steps.begin(), lane.steps.end(), [&](const Step& st) { return st.kind == kind; });
}

/// Drop the buffers no step reads or writes and no extent takes its value from, renumbering the rest in order.
void dropUnusedBuffers(Schedule& s) {
  std::vector<bool> used(s.buffers.size(), false);
  auto mark = [&](const BufRef& r) {
    if (r.buffer < used.size()) used[r.buffer] = true;
  };
  for (const auto& rank : s.lanes)
    for (const Lane& lane : rank)
      for (const Step& st : lane.steps) {
        const uint16_t f = kindInfo(st.kind).fields;
        if (f & kFieldDst) mark(st.dst);
        if (f & kFieldA) mark(st.a);
        if (f & kFieldB) mark(st.b);
      }
  for (const ExtentDecl& e : s.extents)
    if (e.sourced() && e.sourceBuffer < used.size()) used[e.sourceBuffer] = true;
  std::vector<uint16_t> renumber(s.buffers.size(), 0);
  std::vector<BufferDecl> kept;
  for (std::size_t b = 0; b < s.buffers.size(); ++b)
    if (used[b]) {
      renumber[b] = static_cast<uint16_t>(kept.size());
      kept.push_back(s.buffers[b]);
    }
  s.buffers = std::move(kept);
  for (auto& rank : s.lanes)
    for (Lane& lane : rank)
      for (Step& st : lane.steps) {
        const uint16_t f = kindInfo(st.kind).fields;
        if (f & kFieldDst) st.dst.buffer = renumber[st.dst.buffer];
        if (f & kFieldA) st.a.buffer = renumber[st.a.buffer];
        if (f & kFieldB) st.b.buffer = renumber[st.b.buffer];
      }
  for (ExtentDecl& e : s.extents)
    if (e.sourced()) e.sourceBuffer = renumber[e.sourceBuffer];
}

}  // namespace

MoeFfnLayered generateMoeFfnLayered(const MoeFfnSpec& spec, const std::vector<uint32_t>& nodeOf) {
  if (std::any_of(nodeOf.begin(), nodeOf.end(), [&](uint32_t n) { return n != nodeOf.front(); }))
    throw Error(ErrorCode::Unsupported,
                "moe-ffn layered: the ranks span more than one node; the layered baseline is cut for one node (across "
                "nodes the relays' forwarding and their sums share lanes with the dispatch)");
  const Schedule fused = generateMoeFfn(spec, nodeOf);
  MoeFfnLayered out{fused, fused};

  // The dispatch: every lane but the return (the lane with the combine step) and the compute lane's GEMMs and
  // signals; the compute lane keeps its waits, so the op ends when every count and block has arrived.
  Schedule& d = out.dispatch;
  for (auto& rank : d.lanes) {
    std::vector<Lane> kept;
    for (Lane& lane : rank) {
      if (hasKind(lane, StepKind::Combine)) continue;
      if (lane.role == LaneRole::Compute) {
        lane.role = LaneRole::Intra;
        lane.ctas = 1;
        lane.steps.erase(std::remove_if(lane.steps.begin(), lane.steps.end(),
                                        [](const Step& st) { return st.kind != StepKind::Wait; }),
                         lane.steps.end());
      }
      kept.push_back(std::move(lane));
    }
    rank = std::move(kept);
  }
  d.buffers[bufferOf(d, "counts")].kind = BufferKind::Output;
  d.buffers[bufferOf(d, "recv")].kind = BufferKind::Output;
  d.gemms.clear();
  dropUnusedBuffers(d);
  d.info.algo = "layered-dispatch";

  // The return and combine: the lane with the combine step alone, without its waits for the GEMMs ("ffn done": the
  // caller's GEMMs ran before this op); the blocks of "o" it returns are sized by "counts" as in the fused op.
  Schedule& c = out.combine;
  const uint16_t o = bufferOf(c, "o");
  for (auto& rank : c.lanes) {
    std::vector<Lane> kept;
    for (Lane& lane : rank) {
      if (!hasKind(lane, StepKind::Combine)) continue;
      // Its first wait per source is "ffn done", the flag the compute lane signalled; the rest wait for the blocks.
      const uint32_t done = [&] {
        for (const Step& st : lane.steps)
          if (st.kind == StepKind::Wait) return st.flag.id;
        throw Error(ErrorCode::Internal, "moe-ffn layered: the return lane has no wait");
      }();
      lane.steps.erase(std::remove_if(lane.steps.begin(), lane.steps.end(),
                                      [&](const Step& st) { return st.kind == StepKind::Wait && st.flag.id == done; }),
                       lane.steps.end());
      kept.push_back(std::move(lane));
    }
    rank = std::move(kept);
  }
  c.buffers[o].kind = BufferKind::Input;
  c.buffers[bufferOf(c, "counts")].kind = BufferKind::Input;
  c.gemms.clear();
  dropUnusedBuffers(c);
  c.info.algo = "layered-combine";
  return out;
}

}  // namespace mk

// mkernel — small queries on the Schedule IR shared by every layer.
#include "mk/schedule/schedule.hpp"

#include <string>

namespace mk {

int Schedule::bufferIndex(const std::string& name) const noexcept {
  for (std::size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].name == name) return static_cast<int>(i);
  return -1;
}

uint64_t Schedule::stepCount() const noexcept {
  uint64_t n = 0;
  for (const auto& rankLanes : lanes)
    for (const auto& lane : rankLanes) n += lane.steps.size();
  return n;
}

namespace {
/// Calls visit(owner rank) for every user-buffer operand a step of rank `q` names on another rank.
template <class Visit>
void forPeerUserOperands(const Schedule& s, Visit&& visit) {
  auto user = [&](const BufRef& b) {
    return b.buffer < s.buffers.size() && s.buffers[b.buffer].kind != BufferKind::Scratch;
  };
  for (uint32_t q = 0; q < s.lanes.size(); ++q)
    for (const Lane& lane : s.lanes[q])
      for (const Step& st : lane.steps) {
        const uint16_t fields = kindInfo(st.kind).fields;
        for (const BufRef* b : {(fields & kFieldDst) ? &st.dst : nullptr, (fields & kFieldA) ? &st.a : nullptr,
                                (fields & kFieldB) ? &st.b : nullptr})
          if (b && b->rank != q && user(*b)) visit(b->rank);
      }
}
}  // namespace

bool peersTouchUserBuffers(const Schedule& s, uint32_t rank) {
  bool found = false;
  forPeerUserOperands(s, [&](uint32_t owner) { found = found || owner == rank; });
  return found;
}

bool peersTouchUserBuffers(const Schedule& s) {
  bool found = false;
  forPeerUserOperands(s, [&](uint32_t) { found = true; });
  return found;
}

LinkClass linkBetween(const Schedule& s, uint32_t fromRank, uint32_t toRank) noexcept {
  // Out-of-range ranks have no path; the validator reports them, callers must not crash on them.
  if (fromRank >= s.nodeOf.size() || toRank >= s.nodeOf.size()) return LinkClass::None;
  if (fromRank == toRank) return LinkClass::Local;
  return s.nodeOf[fromRank] == s.nodeOf[toRank] ? LinkClass::NVLink : LinkClass::Network;
}

std::string describeStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step) {
  // Tolerates out-of-range indices ("?") because diagnostics about broken schedules call it.
  const char* role = "?";
  const char* kind = "?";
  if (rank < s.lanes.size() && lane < s.lanes[rank].size()) {
    const Lane& l = s.lanes[rank][lane];
    role = toString(l.role);
    if (step < l.steps.size()) kind = toString(l.steps[step].kind);
  }
  std::string out;
  out.reserve(48);
  out += "rank ";
  out += std::to_string(rank);
  out += " lane ";
  out += std::to_string(lane);
  out += " (";
  out += role;
  out += ") step ";
  out += std::to_string(step);
  out += " (";
  out += kind;
  out += ')';
  return out;
}

}  // namespace mk

namespace mk {

const char* protocolFlagProblem(StepKind kind, uint8_t flags) noexcept {
  const uint8_t proto = flags & kStepProtocolBits;
  if (proto == 0) return nullptr;
  if (!kindInfo(kind).protocol)
    return "protocol ll / ll128 (kStepLL, kStepLL128) is valid on put and proxyput steps only";
  if (proto == kStepProtocolBits) return "kStepLL and kStepLL128 are both set (a put has at most one protocol)";
  return nullptr;
}

}  // namespace mk

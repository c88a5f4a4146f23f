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

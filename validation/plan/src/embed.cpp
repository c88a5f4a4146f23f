// mkernel — concurrent copies of a schedule as one schedule (embed.hpp).
#include "mk/plan/embed.hpp"

#include <string>

#include "mk/error.hpp"

namespace mk::plan {

Schedule embedConcurrent(const Schedule& part, const std::vector<std::vector<uint32_t>>& maps,
                         const std::vector<uint32_t>& nodeOf) {
  const uint32_t n = static_cast<uint32_t>(nodeOf.size());
  std::vector<int> owner(n, -1);
  for (std::size_t i = 0; i < maps.size(); ++i) {
    if (maps[i].size() != part.nRanks)
      throw Error(ErrorCode::InvalidArgument, "embedConcurrent: map " + std::to_string(i) + " has " +
                                                  std::to_string(maps[i].size()) + " ranks, the part " +
                                                  std::to_string(part.nRanks));
    for (uint32_t r : maps[i]) {
      if (r >= n || owner[r] != -1)
        throw Error(ErrorCode::InvalidArgument,
                    "embedConcurrent: rank " + std::to_string(r) + (r >= n ? " is out of range" : " is used twice"));
      owner[r] = static_cast<int>(i);
    }
  }
  for (uint32_t r = 0; r < n; ++r)
    if (owner[r] == -1)
      throw Error(ErrorCode::InvalidArgument, "embedConcurrent: rank " + std::to_string(r) + " belongs to no copy");
  for (const auto& lanes : part.lanes)
    for (const Lane& l : lanes)
      for (const Step& st : l.steps)
        if (st.kind == StepKind::Barrier)
          throw Error(ErrorCode::Unsupported, "embedConcurrent: the part has barriers (they join every rank)");

  Schedule out;
  out.nRanks = n;
  out.nodeOf = nodeOf;
  out.nFlags = part.nFlags;
  out.nBarriers = 0;
  out.gemms = part.gemms;
  out.info = part.info;
  out.buffers = part.buffers;
  for (BufferDecl& b : out.buffers) b.count.assign(n, 0);
  out.lanes.assign(n, {});
  for (const auto& map : maps) {
    // Fields a step's kind does not use are left as they are (the structure checks ignore them).
    auto remap = [&](uint32_t& rank) {
      if (rank < part.nRanks) rank = map[rank];
    };
    for (uint32_t j = 0; j < part.nRanks; ++j) {
      const uint32_t r = map[j];
      for (std::size_t b = 0; b < part.buffers.size(); ++b) out.buffers[b].count[r] = part.buffers[b].count[j];
      std::vector<Lane> lanes = part.lanes[j];
      for (Lane& l : lanes)
        for (Step& st : l.steps) {
          remap(st.dst.rank);
          remap(st.a.rank);
          remap(st.b.rank);
          remap(st.flag.rank);
        }
      out.lanes[r] = std::move(lanes);
    }
  }
  return out;
}

}  // namespace mk::plan

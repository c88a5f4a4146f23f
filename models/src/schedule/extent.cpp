// mkernel — runtime extents: lookup, the check of given values, and the counts a rank runs (extent.hpp).
#include <string>

#include "mk/error.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk {

int extentIndex(const Schedule& s, const std::string& name) noexcept {
  for (std::size_t e = 0; e < s.extents.size(); ++e)
    if (s.extents[e].name == name) return static_cast<int>(e);
  return -1;
}

void checkExtentValues(const Schedule& s, const ExtentValues& values) {
  if (values.empty()) return;
  if (values.size() != s.nRanks)
    throw Error(ErrorCode::InvalidArgument, "extent values are given for " + std::to_string(values.size()) +
                                                " ranks; the schedule has " + std::to_string(s.nRanks));
  for (uint32_t r = 0; r < s.nRanks; ++r) {
    if (values[r].size() != s.extents.size())
      throw Error(ErrorCode::InvalidArgument,
                  "rank " + std::to_string(r) + " is given " + std::to_string(values[r].size()) +
                      " extent values; the schedule declares " + std::to_string(s.extents.size()) + " extents");
    for (std::size_t e = 0; e < s.extents.size(); ++e)
      if (values[r][e] > s.extents[e].bound)
        throw Error(ErrorCode::InvalidArgument, "extent '" + s.extents[e].name + "' of rank " + std::to_string(r) +
                                                    " is " + std::to_string(values[r][e]) + ", above its bound " +
                                                    std::to_string(s.extents[e].bound));
  }
}

uint64_t extentValue(const Schedule& s, const ExtentValues& values, uint32_t rank, uint32_t e) noexcept {
  if (e >= s.extents.size()) return 0;
  if (values.empty() || rank >= values.size() || e >= values[rank].size()) return s.extents[e].bound;
  return values[rank][e];
}

uint64_t runtimeCount(const Schedule& s, const Step& st, uint32_t rank, const ExtentValues& values) noexcept {
  if (st.extent == kNoExtent || st.extent >= s.extents.size()) return st.count;
  return scaleToExtent(st.count, s.extents[st.extent].bound, extentValue(s, values, rank, st.extent));
}

uint32_t runtimeRows(const Schedule& s, const GemmShape& g, uint32_t rank, const ExtentValues& values) noexcept {
  if (g.extent == kNoExtent || g.extent >= s.extents.size()) return g.m;
  return static_cast<uint32_t>(scaleToExtent(g.m, s.extents[g.extent].bound, extentValue(s, values, rank, g.extent)));
}

}  // namespace mk

// mkernel — host memory for the CPU reference executor (mk/exec/executor.hpp): every rank's buffers, or those of
// the ranks one process runs.
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/schedule/check.hpp"

namespace mk {

namespace {

/// Check every buffer of every rank (declared counts, the 1 TiB limit), then give the ranks `wanted` says yes to
/// their zeroed buffers; the others keep none.
template <class Wanted>
HostMemory allocateRanks(const Schedule& s, Wanted&& wanted) {
  for (std::size_t b = 0; b < s.buffers.size(); ++b)
    if (const std::string problem = bufferCountProblem(s, b); !problem.empty())
      throw Error(ErrorCode::InvalidSchedule, "schedule: " + problem);
  HostMemory mem;
  mem.bytes.resize(s.nRanks);
  for (uint32_t rank = 0; rank < s.nRanks; ++rank) {
    const bool mine = wanted(rank);
    if (mine) mem.bytes[rank].resize(s.buffers.size());
    for (std::size_t b = 0; b < s.buffers.size(); ++b) {
      const BufferDecl& decl = s.buffers[b];
      const uint64_t elems = decl.count[rank];
      const uint64_t esize = dtypeSize(decl.dtype);
      if (elems > (uint64_t{1} << 40) / esize)
        throw Error(ErrorCode::InvalidArgument, "buffer '" + decl.name + "' on rank " + std::to_string(rank) + " has " +
                                                    std::to_string(elems) +
                                                    " elements: too large for host memory (limit 1 TiB)");
      if (mine) mem.bytes[rank][b].assign(static_cast<std::size_t>(elems * esize), std::byte{0});
    }
  }
  return mem;
}

}  // namespace

HostMemory HostMemory::allocate(const Schedule& s) {
  return allocateRanks(s, [](uint32_t) { return true; });
}

HostMemory HostMemory::allocate(const Schedule& s, const std::vector<uint32_t>& ranks) {
  std::vector<bool> mine(s.nRanks, false);
  for (uint32_t r : ranks) {
    if (r >= s.nRanks)
      throw Error(ErrorCode::InvalidArgument, "HostMemory::allocate: rank " + std::to_string(r) +
                                                  " is outside the schedule's " + std::to_string(s.nRanks) + " ranks");
    mine[r] = true;
  }
  // Only this process's ranks get memory (the others' buffers are another process's).
  return allocateRanks(s, [&](uint32_t r) { return mine[r]; });
}

}  // namespace mk

// mkernel — host memory for the CPU reference executor (mk/exec/executor.hpp): every rank's buffers, or those of
// the ranks one process runs.
#include <string>

#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/schedule/check.hpp"

namespace mk {

HostMemory HostMemory::allocate(const Schedule& s) {
  HostMemory mem;
  mem.bytes.resize(s.nRanks);
  for (uint32_t rank = 0; rank < s.nRanks; ++rank) {
    mem.bytes[rank].resize(s.buffers.size());
    for (std::size_t b = 0; b < s.buffers.size(); ++b) {
      const BufferDecl& decl = s.buffers[b];
      if (const std::string problem = bufferCountProblem(s, b); !problem.empty())
        throw Error(ErrorCode::InvalidSchedule, "schedule: " + problem);
      const uint64_t elems = decl.count[rank];
      const uint64_t esize = dtypeSize(decl.dtype);
      if (elems > (uint64_t{1} << 40) / esize)
        throw Error(ErrorCode::InvalidArgument, "buffer '" + decl.name + "' on rank " + std::to_string(rank) + " has " +
                                                    std::to_string(elems) +
                                                    " elements: too large for host memory (limit 1 TiB)");
      mem.bytes[rank][b].assign(static_cast<std::size_t>(elems * esize), std::byte{0});
    }
  }
  return mem;
}

HostMemory HostMemory::allocate(const Schedule& s, const std::vector<uint32_t>& ranks) {
  for (uint32_t r : ranks)
    if (r >= s.nRanks)
      throw Error(ErrorCode::InvalidArgument, "HostMemory::allocate: rank " + std::to_string(r) +
                                                  " is outside the schedule's " + std::to_string(s.nRanks) + " ranks");
  HostMemory all;
  all.bytes.resize(s.nRanks);
  HostMemory one = allocate(s);
  for (uint32_t r : ranks) all.bytes[r] = std::move(one.bytes[r]);
  return all;
}

}  // namespace mk

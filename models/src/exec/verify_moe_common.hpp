// mkernel — internal: what verifyMoeDispatchGemm and verifyMoeFfn share: the router ids a check runs with, the
// random bf16 inputs and the output sentinel.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>

#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/exec/verify_moe.hpp"
#include "verify_common.hpp"

namespace mk::detail {

/// The sentinel every output element starts as: a quiet NaN no computation yields.
inline constexpr uint32_t kMoeSentinel = 0x7FC0DEADu;

/// The ids a check of `spec` on `s`'s ranks runs with: `given` for MoeRouting::Given (one tokens x topk list per
/// rank, else Error(InvalidArgument) "<who>: given ids ..."), else moeRouting's draw from `seed`.
inline MoeIds moeIdsFor(const Schedule& s, const MoeDispatchGemmSpec& spec, uint64_t seed, MoeRouting routing,
                        const MoeIds& given, const std::string& who) {
  if (routing != MoeRouting::Given) return moeRouting(spec, s.nRanks, routing, seed);
  const uint64_t slots = uint64_t{spec.tokens} * spec.topk;
  if (given.size() != s.nRanks)
    throw Error(ErrorCode::InvalidArgument, who + ": given ids for " + std::to_string(given.size()) +
                                                " ranks, expected " + std::to_string(s.nRanks));
  for (uint32_t r = 0; r < s.nRanks; ++r)
    if (given[r].size() != slots)
      throw Error(ErrorCode::InvalidArgument, who + ": given ids of rank " + std::to_string(r) + " hold " +
                                                  std::to_string(given[r].size()) +
                                                  " entries, expected tokens x topk = " + std::to_string(slots));
  return given;
}

/// Per rank in order: `ids` into buffer `idsBuf`, then each buffer of `bf16` filled with bf16 values uniform in
/// [-1, 1) drawn from `rng`.
inline void fillMoeInputs(HostMemory& mem, const Schedule& s, const MoeIds& ids, uint16_t idsBuf,
                          std::initializer_list<uint16_t> bf16, std::mt19937_64& rng) {
  for (uint32_t r = 0; r < s.nRanks; ++r) {
    std::memcpy(mem.as<int32_t>(r, idsBuf), ids[r].data(), ids[r].size() * sizeof(int32_t));
    for (uint16_t b : bf16) {
      uint16_t* p = mem.as<uint16_t>(r, b);
      for (uint64_t i = 0; i < s.buffers[b].count[r]; ++i) p[i] = floatToBf16(inputValue(InputKind::Uniform, rng(), 0));
    }
  }
}

}  // namespace mk::detail

// mkernel tests — a small moe-ffn spec and its element-wise check on the CPU executor, shared by the moe-ffn tests.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>

#include "mk/algorithms/moe.hpp"
#include "mk/exec/verify_moe.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk::test {

/// E experts per rank, top-`topk` of `tokens` tokens, hidden 16, ffn 8, the return across nodes `ret`.
inline MoeFfnSpec ffnSpec(uint32_t experts, uint32_t topk, uint32_t tokens,
                          MoeCombineReturn ret = MoeCombineReturn::NodeSum) {
  MoeFfnSpec spec;
  spec.experts = experts;
  spec.topk = topk;
  spec.tokens = tokens;
  spec.hidden = 16;
  spec.ffn = 8;
  spec.combineReturn = ret;
  return spec;
}

/// `s` matches verifyMoeFfn's reference on every element of every rank's "y".
inline void checkVerifies(const Schedule& s, const MoeFfnSpec& spec, uint64_t seed, MoeRouting routing,
                          const MoeIds& ids = {}) {
  const VerifyResult v = verifyMoeFfn(s, spec, seed, routing, ids);
  INFO(v.detail);
  CHECK(v.ok);
  CHECK(v.checked == uint64_t{s.nRanks} * spec.tokens * spec.hidden);
}

}  // namespace mk::test

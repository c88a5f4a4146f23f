// Helpers shared by the lowering's CPU tests.
#pragma once

#include <string>

#include "lowering/lowering.hpp"
#include "mk/error.hpp"

namespace mkt {

/// The message of the mk::Error lowering rank `rank` of `s` throws; "" when it lowers.
inline std::string loweringErrorOf(const mk::Schedule& s, uint32_t rank, const mk::runtime::LowerOptions& opt = {}) {
  try {
    mk::runtime::lowerRank(s, rank, opt);
  } catch (const mk::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace mkt

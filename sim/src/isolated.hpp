// mkernel — internal to the replay: a Prediction through the pipe of a forked simulation process (the process
// itself is runIsolated, replay.hpp).
#pragma once

#include <string>

#include "mk/sim/replay.hpp"

namespace mk::sim::detail {

/// `p` as bytes for the pipe (every field, steps and links included).
std::string serialize(const Prediction& p);
/// The Prediction serialize() wrote; Error(Internal) for bytes that are not one.
Prediction deserialize(const std::string& bytes);

}  // namespace mk::sim::detail

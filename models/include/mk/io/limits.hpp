// mkernel — the bounds every reader applies to what it reads (documents, rates, times): one home, so that the
// JSON readers (mk/io/json.hpp), readFile and the docs (user-guide.md, "Bad input") agree. No dependencies.
#pragma once

#include <cstddef>

namespace mk {

/// Deepest nesting of arrays and objects a document may have. Our formats nest at most six levels; the bound
/// keeps every recursive walk (nlohmann's dump(), copies, comparisons) far from the stack's end.
inline constexpr unsigned kMaxJsonDepth = 256;
/// Largest document parseJson accepts by default: a schedule of a few million steps, pretty-printed.
inline constexpr std::size_t kMaxJsonBytes = std::size_t{1} << 30;
/// Largest hand-written configuration (topology, profile, workload, measurement file).
inline constexpr std::size_t kMaxConfigJsonBytes = std::size_t{64} << 20;
/// Characters of a value or a string a message shows before "...".
inline constexpr std::size_t kExcerptChars = 60;

/// The physical ranges readers check rates and times against (profiles, topologies, measurements).
/// 1 PB/s (or PFLOP/s per GPU): a thousand times today's fastest links and tensor cores.
inline constexpr double kMaxRate = 1e6;
/// 1 MB/s (GB/s units): below it the time of the largest message in microseconds leaves double's exact range.
inline constexpr double kMinRate = 1e-3;
/// One second in microseconds: no latency or per-step overhead of a GPU system comes near it.
inline constexpr double kMaxLatencyUs = 1e6;

}  // namespace mk

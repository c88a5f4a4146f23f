// mkernel — Chrome / Perfetto trace-event JSON: the one writer behind every trace the project writes (the
// simulator's, the GPU engine's, mk-validate's measured-vs-simulated one).
//
// What Perfetto's JSON importer needs, and this writer guarantees:
//  * times are integer nanoseconds, written as microseconds with at most 3 decimals (exact), and a slice's
//    end is its own start plus its duration in the same integers: two steps that touch never overlap by a
//    rounding nanosecond (a partial overlap on one track makes the importer drop the later slice);
//  * lane L is thread id L + 1 (tid 0 is "no thread" to Perfetto and is merged into another track); the lane
//    itself is kept in the slice's args as "lane";
//  * every track is named by a process_name / thread_name metadata event.
// Events are serialised one at a time (nlohmann-json for each event, not one document): traces of large runs
// hold millions of events.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace mk::io {

/// Integer nanoseconds of a time in microseconds, rounded to the nearest nanosecond.
int64_t usToNs(double us) noexcept;

/// The trace thread id of lane `lane` (lanes count from 0, Perfetto's threads from 1).
constexpr uint32_t traceTid(uint32_t lane) noexcept { return lane + 1; }

/// One value of a slice's "args" (or of the document's "otherData").
using TraceValue = std::variant<uint64_t, std::string>;
/// Ordered key -> value pairs.
using TraceArgs = std::vector<std::pair<std::string, TraceValue>>;

/// One complete ("X") event on the track (pid, lane).
struct TraceSlice {
  uint32_t pid = 0;
  uint32_t lane = 0;               ///< written as tid traceTid(lane) and as args.lane
  std::string name, cat;           ///< cat may be empty (then not written)
  int64_t startNs = 0, endNs = 0;  ///< endNs < startNs is written as a zero-length slice
  TraceArgs args;
};

/// Builds a trace-event document: metadata first (process and thread names), then slices, in call order.
class TraceWriter {
 public:
  /// `otherData`: free-form facts about the trace (source, alignment), written as "otherData".
  explicit TraceWriter(TraceArgs otherData = {});

  /// Names process `pid` ("rank 3 (node 0)"); `sortIndex` orders processes in the UI.
  void process(uint32_t pid, const std::string& name, std::optional<int64_t> sortIndex = std::nullopt);
  /// Names the track of lane `lane` of process `pid` ("lane 1 (intra)").
  void lane(uint32_t pid, uint32_t lane, const std::string& name);
  /// Adds one slice.
  void slice(const TraceSlice& s);

  /// The whole document ({"displayTimeUnit": "ns", "otherData": {...}, "traceEvents": [...]}), newline-ended.
  /// Call once: the writer hands over the text it built and is empty afterwards.
  std::string finish();

 private:
  void add(const std::string& event);
  std::string out_;  ///< the document so far, without its closing "]}"
  bool first_ = true;
};

}  // namespace mk::io

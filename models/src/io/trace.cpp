// mkernel — the Chrome / Perfetto trace-event writer (mk/io/trace.hpp).
#include "mk/io/trace.hpp"

#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

namespace mk::io {

namespace {

using Json = nlohmann::ordered_json;

Json toJson(const TraceArgs& args) {
  Json j = Json::object();
  for (const auto& [key, value] : args) {
    if (const auto* n = std::get_if<uint64_t>(&value))
      j[key] = *n;
    else
      j[key] = std::get<std::string>(value);
  }
  return j;
}

// Microseconds of an integer nanosecond count. nlohmann writes a double as the shortest text that reads back
// as the same double, and k / 1000 with |k| < 2^53 / 1000 reads back from its own 3-decimal text, so the
// text is the exact nanosecond count in microseconds.
double nsToUs(int64_t ns) { return static_cast<double>(ns) / 1e3; }

}  // namespace

int64_t usToNs(double us) noexcept { return std::isfinite(us) ? std::llround(us * 1e3) : 0; }

TraceWriter::TraceWriter(TraceArgs otherData) {
  Json head{{"displayTimeUnit", "ns"}, {"otherData", toJson(otherData)}};
  out_ = head.dump();
  out_.pop_back();  // reopened: "traceEvents" follows
  out_ += ",\"traceEvents\":[\n";
}

void TraceWriter::add(const std::string& event) {
  if (!first_) out_ += ",\n";
  first_ = false;
  out_ += event;
}

void TraceWriter::process(uint32_t pid, const std::string& name, std::optional<int64_t> sortIndex) {
  add(Json{{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}}.dump());
  if (sortIndex)
    add(Json{{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", *sortIndex}}}}.dump());
}

void TraceWriter::lane(uint32_t pid, uint32_t lane, const std::string& name) {
  add(Json{{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", traceTid(lane)}, {"args", {{"name", name}}}}
          .dump());
}

void TraceWriter::slice(const TraceSlice& s) {
  Json e{{"name", s.name}};
  if (!s.cat.empty()) e["cat"] = s.cat;
  e["ph"] = "X";
  e["ts"] = nsToUs(s.startNs);
  e["dur"] = nsToUs(s.endNs > s.startNs ? s.endNs - s.startNs : 0);
  e["pid"] = s.pid;
  e["tid"] = traceTid(s.lane);
  Json args = toJson(s.args);
  args["lane"] = s.lane;
  e["args"] = std::move(args);
  add(e.dump());
}

std::string TraceWriter::finish() {
  out_ += "\n]}\n";
  return std::move(out_);  // the document is built in place: a trace of millions of events is not copied
}

}  // namespace mk::io

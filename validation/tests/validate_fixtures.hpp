// Measurement records and files for the validation tests: an mkernel collective record as mk-bench writes it,
// a file of records on 2 x H200, and the h200x2 datasheet profile.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/topology/topology.hpp"

namespace mkt {

inline mk::MeasurementRecord coll(const std::string& op, const std::string& algo, uint64_t bytes, uint64_t count,
                                  double timeUs = 10.0) {
  mk::MeasurementRecord r;
  r.op = op;
  r.impl = "mkernel";
  r.algo = algo;
  r.dtype = "float32";
  r.ranks = 2;
  r.bytes = bytes;
  r.timeUs = timeUs;
  r.iters = 40;
  r.stat = "median";
  r.extra = {
      {"count", std::to_string(count)}, {"chunks", "1"}, {"channels", "1"}, {"redop", "\"sum\""}, {"inplace", "false"}};
  return r;
}

inline mk::MeasurementFile file(std::vector<mk::MeasurementRecord> records, const std::string& gpu = "NVIDIA H200",
                                int gpus = 2) {
  mk::MeasurementFile f;
  f.schema = "mkernel.measurement.v1";
  f.system = {{"gpu", "\"" + gpu + "\""}, {"gpus", std::to_string(gpus)}, {"link", "\"NV18\""}};
  f.date = "2026-11-29";
  f.commit = "0123abcd";
  f.command = "mk-bench allreduce";
  f.records = std::move(records);
  return f;
}

/// The message of the mk::Error `fn` throws ("" when it does not throw).
inline std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const mk::Error& e) {
    return e.message();
  }
  return "";
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

inline const mk::Profile& datasheet() {
  static const mk::Profile p = mk::defaultProfile(mk::topologyPreset("h200x2"));
  return p;
}

}  // namespace mkt

#include "mk/validation/validate.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "mk/algorithms/request.hpp"
#include "mk/error.hpp"
#include "mk/io/json.hpp"
#include "mk/io/trace.hpp"
#include "mk/resources.hpp"
#include "mk/util/format.hpp"
#include "mk/util/stats.hpp"
#include "mk/validation/prediction_cache.hpp"
#include "mk/validation/validate_layered.hpp"

namespace mk {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw Error(ErrorCode::InvalidArgument, where + ": " + what);
}

/// An extra field of the record (kept as JSON text by the measurement parser), parsed; none when absent.
std::optional<json> extraField(const MeasurementRecord& r, const char* key) {
  auto it = r.extra.find(key);
  if (it == r.extra.end()) return std::nullopt;
  return json::parse(it->second);
}

/// A positive integer field at most `max`; `required` makes its absence an error.
std::optional<uint64_t> positiveField(const MeasurementRecord& r, const char* key, const std::string& where,
                                      bool required, uint64_t max = kMaxElements) {
  const auto v = extraField(r, key);
  if (!v) {
    if (required)
      bad(where, std::string("missing field '") + key + "' (needed to regenerate the schedule the engine ran)");
    return std::nullopt;
  }
  return json_get::unsignedInt(*v, where + ": field '" + key + "'", max, 1);
}

/// One prediction's share of --max-memory: options.jobs of them run at once.
uint64_t memoryShare(const ValidationOptions& options) {
  const uint64_t limit = options.maxMemory > 0 ? options.maxMemory : defaultMaxMemory();
  return limit / std::max(1u, options.jobs);
}

/// What predicting one record spends besides its schedule: the replay and the platform of its nodes.
template <class Request>
MemoryJob predictionJob(const Topology& topo, const Request& request) {
  MemoryJob job;
  job.simulate = true;
  job.platformGpus = static_cast<uint64_t>(topo.node.gpus) * ((request.nRanks + topo.node.gpus - 1) / topo.node.gpus);
  return job;
}

std::string describeRecord(const MeasurementRecord& r) {
  return r.op + " " + (r.algo.empty() ? "-" : r.algo) + " " + std::to_string(r.bytes) + " B";
}

std::string generatorOf(const std::string& algo) {
  static const std::string kAuto = "auto:";
  return algo.rfind(kAuto, 0) == 0 ? algo.substr(kAuto.size()) : algo;
}

bool algoSelected(const std::vector<std::string>& algos, const std::string& recorded) {
  if (algos.empty()) return true;
  for (const auto& a : algos)
    if (a == recorded || a == generatorOf(recorded)) return true;
  return false;
}

/// The path a provenance entry names: "f.json (run commit abc)" -> "f.json".
std::string provenancePath(const std::string& entry) {
  const auto at = entry.find(" (run commit ");
  return at == std::string::npos ? entry : entry.substr(0, at);
}

bool sameFile(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  std::error_code ea, eb;
  const fs::path ca = fs::weakly_canonical(a, ea), cb = fs::weakly_canonical(b, eb);
  if (!ea && !eb && ca == cb) return true;
  return fs::path(a).filename() == fs::path(b).filename();
}

/// The cluster with the ranks of `rq` placed as its run placed them (placeRecordRanks).
Placement placeRecord(const std::string& cluster, const RecordSchedule& rq) {
  return Placement{placeRecordRanks(cluster, rq.nRanks, rq.nodes), rq.nRanks};
}

/// One prediction to make: the schedule of a request on its placement. Records of the same request (repeated
/// runs, "auto:<generator>" beside the generator itself, in place or not) share one job: the simulation is
/// deterministic, and each job is a simulation process of its own.
struct Job {
  RecordSchedule request;
  Schedule schedule;
  Topology topo;
};

bool sameSimulation(const RecordSchedule& a, const RecordSchedule& b) noexcept {
  return a.spec == b.spec && a.gen == b.gen && a.nRanks == b.nRanks && a.nodes == b.nodes;
}

}  // namespace

Topology placeRecordRanks(const std::string& cluster, uint32_t nRanks, uint32_t nodes) {
  Placement p = placeRanks(cluster, nodes, nRanks);
  if (nodes > 0 && p.topo.node.gpus != nRanks / nodes)
    throw Error(ErrorCode::InvalidArgument,
                "the record ran " + std::to_string(nRanks) + " ranks on " + std::to_string(nodes) + " nodes (" +
                    std::to_string(nRanks / nodes) + " per node), but cluster " + p.topo.name + " has " +
                    std::to_string(p.topo.node.gpus) + " GPU(s) per node: give --cluster a topology with " +
                    std::to_string(nRanks / nodes) + " GPU(s) per node");
  return p.topo;
}

bool isValidatedRecord(const MeasurementRecord& r) noexcept {
  return r.impl == "mkernel" && parseCollOp(r.op).has_value();
}

RecordSchedule recordSchedule(const MeasurementRecord& r, const std::string& where) {
  RecordSchedule out;
  const auto op = parseCollOp(r.op);
  if (!op)
    bad(where,
        "op '" + r.op + "' is not a collective (expected allreduce, allgather, reducescatter, broadcast, alltoall)");
  out.spec.op = *op;
  if (r.algo.empty()) bad(where, "missing field 'algo': the record does not say which generator ran");
  if (r.algo == "auto")
    bad(where, "algo 'auto' does not say which generator ran (mk-bench records 'auto:<generator>')");
  out.chosenByAuto = r.algo != generatorOf(r.algo);
  try {
    out.spec.algo = requireAlgorithm(*op, generatorOf(r.algo));
    out.spec.dtype = requireDType(r.dtype, "dtype");
  } catch (const Error& e) {
    bad(where, e.message() + (e.code() == ErrorCode::NotFound ? "; a record may also say auto:<algorithm>" : ""));
  }
  out.nRanks = r.ranks;
  if (out.nRanks == 0) bad(where, "ranks must be >= 1");
  // The generators' own bounds: a record cannot ask for more work than the command line could.
  out.gen.chunks = static_cast<uint32_t>(*positiveField(r, "chunks", where, true, kMaxChunks));
  out.gen.channels = static_cast<uint32_t>(*positiveField(r, "channels", where, true, kMaxChannels));
  if (const auto nodes = positiveField(r, "nodes", where, false)) {
    if (*nodes > out.nRanks || out.nRanks % *nodes != 0)
      bad(where, "field 'nodes' " + std::to_string(*nodes) + " does not divide the record's " +
                     std::to_string(out.nRanks) + " ranks into equal nodes");
    out.nodes = static_cast<uint32_t>(*nodes);
  }
  // The puts' protocol (mk-bench --protocol): records from before LL packets have none and ran plain puts.
  out.gen.protocol = Protocol::Simple;
  if (const auto pr = extraField(r, "protocol")) {
    const auto p = pr->is_string() ? parseProtocol(pr->get<std::string>()) : std::nullopt;
    if (!p) bad(where, "field 'protocol' must be auto, simple, ll or ll128 (got " + describeJson(*pr) + ")");
    out.gen.protocol = *p;
  }
  if (const auto red = extraField(r, "redop")) {
    try {
      out.spec.redop = requireRedOp(red->is_string() ? excerpt(red->get<std::string>()) : describeJson(*red), "redop");
    } catch (const Error& e) {
      bad(where, e.message());
    }
  }
  if (const auto ip = extraField(r, "inplace")) {
    if (!ip->is_boolean()) bad(where, "field 'inplace' must be true or false (got " + describeJson(*ip) + ")");
    out.inPlace = ip->get<bool>();
  }
  if (const auto root = extraField(r, "root")) {
    if (!root->is_number_unsigned() || root->get<uint64_t>() >= out.nRanks)
      bad(where,
          "field 'root' must be a rank in 0.." + std::to_string(out.nRanks - 1) + " (got " + describeJson(*root) + ")");
    out.spec.root = root->get<uint32_t>();
  }
  const std::string elems = std::string(toString(out.spec.dtype)) + " on " + std::to_string(out.nRanks) + " ranks";
  if (const auto count = positiveField(r, "count", where, false)) {
    out.spec.count = *count;
    const uint64_t b = opBytes(out.spec, out.nRanks);
    if (b != r.bytes)
      bad(where, "count " + std::to_string(*count) + " of " + elems + " is " + std::to_string(b) + " bytes for " +
                     r.op + ", but the record says bytes " + std::to_string(r.bytes));
  } else {
    out.spec.count = countForBytes(out.spec.op, r.bytes, out.spec.dtype, out.nRanks);
    if (out.spec.count == 0)
      bad(where, "bytes " + std::to_string(r.bytes) + " holds less than one " + elems + " element per rank block");
    if (opBytes(out.spec, out.nRanks) != r.bytes)
      bad(where, "bytes " + std::to_string(r.bytes) + " is not a whole number of " + elems +
                     " elements (per rank block) and the record has no 'count'");
  }
  return out;
}

double errorPct(double predictedUs, double measuredUs) noexcept {
  return (predictedUs - measuredUs) / measuredUs * 100.0;
}

ErrorStats errorStats(const std::vector<double>& errPct) {
  ErrorStats s;
  if (errPct.empty()) return s;
  std::vector<double> a;
  a.reserve(errPct.size());
  for (double e : errPct) a.push_back(std::fabs(e));
  s.n = a.size();
  s.medianAbsPct = median(a);
  s.p90AbsPct = quantile(a, 0.9);
  s.maxAbsPct = *std::max_element(a.begin(), a.end());
  return s;
}

std::string formatSummaryLine(const ErrorStats& s, const std::string& prefix) {
  return strprintf("%s: n=%zu median_abs_err_pct=%.2f p90_abs_err_pct=%.2f max_abs_err_pct=%.2f", prefix.c_str(), s.n,
                   s.medianAbsPct, s.p90AbsPct, s.maxAbsPct);
}

ValidationResult validateMeasurements(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                                      const Profile& profile, const ValidationOptions& options) {
  if (names.size() != files.size())
    throw Error(ErrorCode::InvalidArgument, "validateMeasurements: " + std::to_string(files.size()) + " files but " +
                                                std::to_string(names.size()) + " names");
  for (const auto& op : options.ops) (void)requireCollOp(op, "op");
  ValidationResult res;
  for (std::size_t f = 0; f < files.size(); ++f) {
    FileSummary fs;
    fs.name = names[f];
    fs.cluster = inferCluster(files[f]);
    fs.runCommit = files[f].commit;
    fs.records = files[f].records.size();
    res.files.push_back(fs);
  }
  res.cluster = resolveCluster(files, names, options.cluster);
  // Resolve the cluster once up front: an unknown preset or a bad topology file is the input's fault, not a record's.
  (void)loadTopology(res.cluster);

  std::vector<Job> jobs;
  std::vector<std::size_t> rowJob;                                ///< the job of each row
  std::map<std::pair<uint32_t, uint32_t>, Placement> placements;  ///< by (ranks, nodes)
  for (std::size_t f = 0; f < files.size(); ++f) {
    FileSummary& fs = res.files[f];
    for (std::size_t i = 0; i < files[f].records.size(); ++i) {
      const MeasurementRecord& r = files[f].records[i];
      if (!isValidatedRecord(r)) {
        ++res.ignored;
        ++fs.ignored;
        continue;
      }
      if (!isSelected(r, options)) {
        ++res.filtered;
        ++fs.filtered;
        continue;
      }
      const std::string where = names[f] + ": records[" + std::to_string(i) + "] (" + describeRecord(r) + ")";
      ValidationRow row;
      row.file = names[f];
      row.index = i;
      row.algo = r.algo;
      row.bytes = r.bytes;
      row.measuredUs = r.timeUs;
      std::size_t j = 0;
      bool newJob = false;  // a row skipped below takes its new job with it
      try {
        row.request = recordSchedule(r, where);  // its errors already name the record
        const CollectiveSpec& spec = row.request.spec;
        while (j < jobs.size() && !sameSimulation(jobs[j].request, row.request)) ++j;
        if (j == jobs.size()) {
          Job job;
          job.request = row.request;
          try {
            const std::pair<uint32_t, uint32_t> key{row.request.nRanks, row.request.nodes};
            auto it = placements.find(key);
            if (it == placements.end()) it = placements.emplace(key, placeRecord(res.cluster, row.request)).first;
            job.topo = it->second.topo;
            checkMemory(spec, job.topo.layout(row.request.nRanks), row.request.gen,
                        predictionJob(job.topo, row.request), memoryShare(options));
            job.schedule = generate(spec, job.topo.layout(row.request.nRanks), row.request.gen);
          } catch (const Error& e) {
            throw Error(e.code(), where + ": " + e.message());
          }
          jobs.push_back(std::move(job));
          newJob = true;
        }
        const Job& job = jobs[j];
        row.steps = job.schedule.stepCount();
        if (row.request.inPlace) {
          if (!(profile.local.bwGBs > 0))
            throw Error(ErrorCode::InvalidArgument, where +
                                                        ": in place: pricing the input staging copy needs profile "
                                                        "local.bwGBs > 0 (got " +
                                                        std::to_string(profile.local.bwGBs) + ")");
          const double inBytes =
              static_cast<double>(inputCount(spec, row.request.nRanks)) * static_cast<double>(dtypeSize(spec.dtype));
          row.stagingUs = profile.local.alphaUs + inBytes / (profile.local.bwGBs * 1e3);
        }
        try {
          row.closedUs =
              closedForm(spec, row.request.gen, job.topo, row.request.nRanks, profile).totalUs + row.stagingUs;
        } catch (const Error& e) {
          // Not every generator has a closed form: the row then has none (the simulator still judges it).
          if (e.code() != ErrorCode::Unsupported) throw Error(e.code(), where + ": closed form: " + e.message());
        }
      } catch (const Error& e) {
        if (!options.skipBad) throw;
        if (newJob) jobs.pop_back();
        res.skipped.push_back({names[f], i, e.message()});
        ++fs.skipped;
        continue;
      }
      ++fs.validated;
      res.rows.push_back(std::move(row));
      rowJob.push_back(j);
    }
  }

  std::vector<TotalJob> work;
  for (const Job& j : jobs) work.push_back(TotalJob{&j.schedule, &j.topo, &profile});
  const std::vector<double> simUs = predictTotals(
      work, options.jobs, options.cache,
      [&](std::size_t k) {
        const ValidationRow& row = res.rows[static_cast<std::size_t>(std::find(rowJob.begin(), rowJob.end(), k) -
                                                                     rowJob.begin())];  // the first row of this job
        return row.file + ": records[" + std::to_string(row.index) + "]";
      },
      &res.fromCache);
  res.simulations = jobs.size();

  std::vector<double> simErr, closedErr;
  for (std::size_t k = 0; k < res.rows.size(); ++k) {
    ValidationRow& row = res.rows[k];
    row.simUs = simUs[rowJob[k]] + row.stagingUs;
    row.simErrPct = errorPct(row.simUs, row.measuredUs);
    simErr.push_back(row.simErrPct);
    if (row.closedUs) {
      row.closedErrPct = errorPct(*row.closedUs, row.measuredUs);
      closedErr.push_back(*row.closedErrPct);
    }
  }
  res.sim = errorStats(simErr);
  res.closed = errorStats(closedErr);
  return res;
}

bool isSelected(const MeasurementRecord& r, const ValidationOptions& options) {
  if (!options.ops.empty() && std::find(options.ops.begin(), options.ops.end(), r.op) == options.ops.end())
    return false;
  return algoSelected(options.algos, r.algo);
}

void checkProfileIndependence(const ProfileProvenance& provenance, const std::string& profileName,
                              const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                              const ValidationOptions& options) {
  for (const auto& entry : provenance.measurements) {
    const std::string fitted = provenancePath(entry);
    for (std::size_t f = 0; f < files.size() && f < names.size(); ++f) {
      if (!sameFile(fitted, names[f])) continue;
      const auto n = std::count_if(files[f].records.begin(), files[f].records.end(), [&](const MeasurementRecord& r) {
        return isValidatedRecord(r) && isSelected(r, options);
      });
      if (n == 0) continue;
      throw Error(ErrorCode::InvalidArgument,
                  "profile " + profileName + " was fitted on " + fitted + ", and " + names[f] + " holds " +
                      std::to_string(n) +
                      " collective record(s) validated here: judging a profile on a file it "
                      "was fitted from is circular; fit it on a micro-benchmark file without these records");
    }
  }
}

Regenerated regenerate(const ValidationRow& row, const std::string& cluster) {
  Regenerated out;
  out.topo = placeRecord(cluster, row.request).topo;
  out.schedule = generate(row.request.spec, out.topo.layout(row.request.nRanks), row.request.gen);
  return out;
}

SideBySide sideBySideTrace(const Schedule& s, const sim::Prediction& predicted, const std::string& measuredTraceJson,
                           const std::string& traceName, std::optional<uint64_t> measuredOp, const std::string& title) {
  SideBySide out;
  // Measured step of one op: (rank, lane, step) -> (start, duration) in nanoseconds, aligned.
  using Key = std::tuple<uint32_t, uint32_t, uint32_t>;
  std::map<Key, std::pair<int64_t, int64_t>> measured;
  double predictedFirstUs = 0;
  if (!predicted.steps.empty()) {
    predictedFirstUs = predicted.steps.front().startUs;
    for (const auto& st : predicted.steps) predictedFirstUs = std::min(predictedFirstUs, st.startUs);
  }
  if (!measuredTraceJson.empty()) {
    const json root = parseJson(measuredTraceJson, traceName);
    const json* events = root.is_array() ? &root : nullptr;
    if (root.is_object() && root.contains("traceEvents") && root["traceEvents"].is_array())
      events = &root["traceEvents"];
    if (events == nullptr)
      throw Error(ErrorCode::ParseError,
                  traceName + ": expected a Chrome trace (an object with a \"traceEvents\" array)");
    struct Ev {
      uint32_t rank, lane, step;
      std::string kind;
      double ts, dur;
    };
    std::map<uint64_t, std::vector<Ev>> byOp;
    for (std::size_t i = 0; i < events->size(); ++i) {
      const json& e = (*events)[i];
      const std::string where = traceName + ": traceEvents[" + std::to_string(i) + "]";
      if (!e.is_object()) throw Error(ErrorCode::ParseError, where + ": must be an object");
      // e.value("ph", "") throws nlohmann's type_error (a raw exception, exit 1) for a phase that is not a string.
      const auto ph = e.find("ph");
      if (ph != e.end() && !ph->is_string())
        failField(where + ": ph", "must be a string (the event's phase: \"X\" for a step)", *ph);
      if (ph == e.end() || *ph != "X") continue;  // metadata, counters
      for (const char* k : {"pid", "tid", "ts", "dur", "name", "args"})
        if (!e.contains(k))
          throw Error(ErrorCode::ParseError, where + ": missing '" + k + "' (mk-bench --trace format)");
      const json& args = e["args"];
      if (!args.is_object() || !args.contains("op") || !args.contains("step") || !args["op"].is_number_unsigned() ||
          !args["step"].is_number_unsigned())
        throw Error(ErrorCode::ParseError,
                    where + ": args must hold unsigned 'op' and 'step' (mk-bench --trace format)");
      if (!e["pid"].is_number_unsigned() || !e["tid"].is_number_unsigned() || !e["ts"].is_number() ||
          !e["dur"].is_number() || !e["name"].is_string())
        throw Error(ErrorCode::ParseError, where + ": pid and tid must be unsigned, ts and dur numbers, name a string");
      // Traces of mk::io::TraceWriter carry the lane in args (tid = lane + 1); older ones had tid = lane.
      const bool hasLane = args.contains("lane") && args["lane"].is_number_unsigned();
      const uint32_t lane = hasLane ? args["lane"].get<uint32_t>() : e["tid"].get<uint32_t>();
      byOp[args["op"].get<uint64_t>()].push_back({e["pid"].get<uint32_t>(), lane, args["step"].get<uint32_t>(),
                                                  e["name"].get<std::string>(), e["ts"].get<double>(),
                                                  e["dur"].get<double>()});
    }
    if (byOp.empty()) throw Error(ErrorCode::ParseError, traceName + ": holds no step event (\"ph\": \"X\")");
    // Why an op is not this schedule's, or "" when it is: every event one of its steps, every step once.
    auto mismatch = [&](const std::vector<Ev>& evs) -> std::string {
      std::set<Key> seen;
      for (const Ev& e : evs) {
        if (e.rank >= s.nRanks || e.lane >= s.lanes[e.rank].size() || e.step >= s.lanes[e.rank][e.lane].steps.size())
          return "rank " + std::to_string(e.rank) + " lane " + std::to_string(e.lane) + " step " +
                 std::to_string(e.step) + " is not in the schedule";
        const char* kind = toString(s.lanes[e.rank][e.lane].steps[e.step].kind);
        if (e.kind != kind)
          return describeStep(s, e.rank, e.lane, e.step) + " is a " + kind + ", the trace says " + e.kind;
        if (!seen.insert({e.rank, e.lane, e.step}).second)
          return describeStep(s, e.rank, e.lane, e.step) + " appears twice";
      }
      if (seen.size() != s.stepCount())
        return std::to_string(seen.size()) + " of the schedule's " + std::to_string(s.stepCount()) + " steps traced";
      return "";
    };
    uint64_t chosen = 0;
    if (measuredOp) {
      auto it = byOp.find(*measuredOp);
      if (it == byOp.end())
        throw Error(ErrorCode::InvalidArgument, traceName + ": has no op " + std::to_string(*measuredOp) + " (ops " +
                                                    std::to_string(byOp.begin()->first) + ".." +
                                                    std::to_string(byOp.rbegin()->first) + ")");
      const std::string why = mismatch(it->second);
      if (!why.empty())
        throw Error(ErrorCode::InvalidArgument,
                    traceName + ": op " + std::to_string(*measuredOp) + " is not the record's schedule: " + why);
      chosen = *measuredOp;
    } else {
      std::vector<uint64_t> matching;
      std::string firstWhy;
      for (const auto& [op, evs] : byOp) {
        const std::string why = mismatch(evs);
        if (why.empty())
          matching.push_back(op);
        else if (firstWhy.empty())
          firstWhy = "op " + std::to_string(op) + ": " + why;
      }
      if (matching.empty())
        throw Error(ErrorCode::InvalidArgument,
                    traceName + ": no op has the record's schedule (" + std::to_string(s.stepCount()) + " steps on " +
                        std::to_string(s.nRanks) + " ranks; " + firstWhy + "): trace the same op, algorithm and size");
      if (matching.size() > 1) {
        std::string list;
        for (std::size_t k = 0; k < matching.size() && k < 8; ++k)
          list += (k ? ", " : "") + std::to_string(matching[k]);
        throw Error(ErrorCode::InvalidArgument,
                    traceName + ": " + std::to_string(matching.size()) + " ops have the record's schedule (" + list +
                        (matching.size() > 8 ? ", ..." : "") +
                        "): pick one with --measured-op (mk-bench traces one op per size, in sweep order)");
      }
      chosen = matching.front();
    }
    out.measuredOp = chosen;
    // Each GPU stamps steps with its own %globaltimer, and the clocks of two GPUs differ by an offset the
    // trace does not record: align every rank on its own first step (that rank's first measured step starts
    // with its first predicted step), so no rank's steps float by another GPU's clock offset.
    std::map<uint32_t, double> firstMeasured, firstPredicted;
    for (const Ev& e : byOp[chosen]) {
      auto [it, fresh] = firstMeasured.emplace(e.rank, e.ts);
      if (!fresh) it->second = std::min(it->second, e.ts);
    }
    for (const auto& st : predicted.steps) {
      auto [it, fresh] = firstPredicted.emplace(st.rank, st.startUs);
      if (!fresh) it->second = std::min(it->second, st.startUs);
    }
    for (const Ev& e : byOp[chosen])
      measured[{e.rank, e.lane, e.step}] = {
          io::usToNs(e.ts) - io::usToNs(firstMeasured[e.rank]) + io::usToNs(firstPredicted[e.rank]), io::usToNs(e.dur)};
    out.note = strprintf(
        "measured: op %llu of %s, each rank shifted so that its first step starts with its predicted "
        "first step (the first at %.3f us after the enqueue, i.e. after the profile's dispatch): a GPU "
        "trace has no enqueue time, and each GPU's clock has its own offset",
        static_cast<unsigned long long>(chosen), traceName.c_str(), predictedFirstUs);
  } else {
    out.note = "no measured trace given (mk-bench --trace, then --measured-trace): the predicted timeline only";
  }

  io::TraceWriter w({{"source", std::string("mk-validate")}, {"record", title}, {"alignment", out.note}});
  auto pidOf = [](uint32_t rank, bool simulated) { return 2 * rank + (simulated ? 1 : 0); };
  for (uint32_t r = 0; r < s.nRanks; ++r) {
    for (int simulated = measuredTraceJson.empty() ? 1 : 0; simulated <= 1; ++simulated) {
      const uint32_t pid = pidOf(r, simulated != 0);
      w.process(pid,
                std::string(simulated ? "simulated" : "measured") + " rank " + std::to_string(r) + " (node " +
                    std::to_string(r < s.nodeOf.size() ? s.nodeOf[r] : 0) + ")",
                pid);
      for (uint32_t l = 0; l < s.lanes[r].size(); ++l)
        w.lane(pid, l, "lane " + std::to_string(l) + " (" + toString(s.lanes[r][l].role) + ")");
    }
  }
  for (const sim::StepRecord& st : predicted.steps) {
    StepComparison c;
    c.rank = st.rank;
    c.lane = st.lane;
    c.step = st.step;
    c.kind = toString(st.kind);
    c.simStartUs = st.startUs;
    c.simDurUs = st.endUs - st.startUs;
    const io::TraceArgs args{{"step", uint64_t{st.step}}, {"kind", c.kind}, {"bytes", uint64_t{st.bytes}}};
    io::TraceSlice sl{pidOf(st.rank, true), st.lane, c.kind, toString(st.link), io::usToNs(st.startUs),
                      io::usToNs(st.endUs), args};
    sl.args.emplace_back("engine", std::string("simulated"));
    w.slice(sl);
    auto it = measured.find({st.rank, st.lane, st.step});
    if (it != measured.end()) {
      c.measStartUs = static_cast<double>(it->second.first) / 1e3;
      c.measDurUs = static_cast<double>(it->second.second) / 1e3;
      sl.pid = pidOf(st.rank, false);
      sl.startNs = it->second.first;
      sl.endNs = it->second.first + it->second.second;
      sl.args = args;
      sl.args.emplace_back("op", *out.measuredOp);
      sl.args.emplace_back("engine", std::string("measured"));
      w.slice(sl);
    }
    out.steps.push_back(std::move(c));
  }
  out.json = w.finish();
  return out;
}

std::string honestyStatement(const std::string& profilePath, const Profile& profile, const ProfileProvenance& prov) {
  if (profilePath.empty())
    return "The profile is the cluster's datasheet defaults (mk::defaultProfile): nothing was fitted, so no "
           "measurement went into it.";
  if (prov.tool.rfind("mk-calibrate", 0) == 0) {
    std::string files;
    for (const auto& m : prov.measurements) files += (files.empty() ? "" : "; ") + m;
    return "The profile was fitted by mk-calibrate on micro-benchmark (calib-*) records only (mk-calibrate reads "
           "no other record) from: " +
           (files.empty() ? std::string("(no file listed)") : files) +
           ". The collective records judged here were never fitted.";
  }
  return "The profile " + profilePath +
         " was not produced by mk-calibrate (tool: " + (prov.tool.empty() ? std::string("not recorded") : prov.tool) +
         "; source: " + profile.source +
         "): this report cannot vouch that it was fitted on micro-benchmark records only.";
}

std::string validationToJson(const ValidationResult& result, const ValidationContext& ctx, const SideBySide* trace,
                             const ValidationRow* traceRow, const std::string& traceFile,
                             const std::string& measuredTrace) {
  auto stats = [](const ErrorStats& s) {
    return json{{"n", s.n},
                {"median_abs_err_pct", s.medianAbsPct},
                {"p90_abs_err_pct", s.p90AbsPct},
                {"max_abs_err_pct", s.maxAbsPct}};
  };
  json root;
  root["schema"] = kValidationSchema;
  root["tool"] = {{"command", ctx.command}, {"commit", ctx.commit}};
  root["cluster"] = result.cluster;
  json profile = json::parse(profileToJson(ctx.profile, ctx.provenance));
  profile["path"] = ctx.profilePath.empty() ? json(nullptr) : json(ctx.profilePath);
  root["profile"] = profile;
  root["honesty"] = ctx.honesty;
  json files = json::array();
  for (const auto& f : result.files)
    files.push_back({{"path", f.name},
                     {"system", f.cluster},
                     {"run_commit", f.runCommit},
                     {"records", f.records},
                     {"validated", f.validated},
                     {"ignored", f.ignored},
                     {"filtered", f.filtered},
                     {"skipped", f.skipped}});
  root["files"] = files;
  json summary = {{"sim", stats(result.sim)},          {"closed_form", stats(result.closed)},
                  {"gated", "sim.median_abs_err_pct"}, {"ignored", result.ignored},
                  {"filtered", result.filtered},       {"skipped", result.skipped.size()}};
  summary["max_median_err_pct"] = ctx.maxMedianErrPct ? json(*ctx.maxMedianErrPct) : json(nullptr);
  summary["gate_passed"] = ctx.maxMedianErrPct ? json(result.sim.medianAbsPct <= *ctx.maxMedianErrPct) : json(nullptr);
  summary["max_max_err_pct"] = ctx.maxMaxErrPct ? json(*ctx.maxMaxErrPct) : json(nullptr);
  summary["max_gate_passed"] = ctx.maxMaxErrPct ? json(result.sim.maxAbsPct <= *ctx.maxMaxErrPct) : json(nullptr);
  if (ctx.layered != nullptr) {
    const LayeredValidation& l = *ctx.layered;
    json n = stats(l.stats);
    n["max_median_err_pct"] = ctx.maxMedianErrNcclPct ? json(*ctx.maxMedianErrNcclPct) : json(nullptr);
    n["gate_passed"] = ctx.maxMedianErrNcclPct ? json(l.stats.medianAbsPct <= *ctx.maxMedianErrNcclPct) : json(nullptr);
    n["ignored"] = l.ignored;
    summary["nccl"] = n;
    json nrows = json::array();
    for (const auto& r : l.rows)
      nrows.push_back({{"file", r.file},
                       {"index", r.index},
                       {"op", r.op},
                       {"bytes", r.bytes},
                       {"choice", r.choice},
                       {"launches_per_op", r.launchesPerOp},
                       {"measured_us", r.measuredUs},
                       {"gpu_us", r.gpuUs},
                       {"predicted_us", r.predictedUs},
                       {"err_pct", r.errPct}});
    root["nccl_rows"] = nrows;
  }
  root["summary"] = summary;
  if (ctx.fused != nullptr) root["fused"] = json::parse(fusedValidationToJson(*ctx.fused, ctx.maxMedianErrFusedPct));
  json rows = json::array();
  for (const auto& r : result.rows) {
    const RecordSchedule& q = r.request;
    rows.push_back({{"file", r.file},
                    {"index", r.index},
                    {"op", toString(q.spec.op)},
                    {"algo", r.algo},
                    {"generator", toString(q.spec.algo)},
                    {"auto", q.chosenByAuto},
                    {"dtype", toString(q.spec.dtype)},
                    {"redop", toString(q.spec.redop)},
                    {"ranks", q.nRanks},
                    {"bytes", r.bytes},
                    {"count", q.spec.count},
                    {"chunks", q.gen.chunks},
                    {"channels", q.gen.channels},
                    {"inplace", q.inPlace},
                    {"steps", r.steps},
                    {"measured_us", r.measuredUs},
                    {"sim_us", r.simUs},
                    {"closed_us", r.closedUs ? json(*r.closedUs) : json(nullptr)},
                    {"staging_us", r.stagingUs},
                    {"sim_err_pct", r.simErrPct},
                    {"closed_err_pct", r.closedErrPct ? json(*r.closedErrPct) : json(nullptr)}});
  }
  root["rows"] = rows;
  json skipped = json::array();
  for (const auto& s : result.skipped) skipped.push_back({{"file", s.file}, {"index", s.index}, {"reason", s.reason}});
  root["skipped"] = skipped;
  if (trace != nullptr && traceRow != nullptr) {
    json steps = json::array();
    for (const auto& c : trace->steps)
      steps.push_back({{"rank", c.rank},
                       {"lane", c.lane},
                       {"step", c.step},
                       {"kind", c.kind},
                       {"sim_start_us", c.simStartUs},
                       {"sim_dur_us", c.simDurUs},
                       {"meas_start_us", c.measStartUs ? json(*c.measStartUs) : json(nullptr)},
                       {"meas_dur_us", c.measDurUs ? json(*c.measDurUs) : json(nullptr)}});
    root["trace"] = {{"file", traceFile},
                     {"record",
                      {{"file", traceRow->file},
                       {"index", traceRow->index},
                       {"op", toString(traceRow->request.spec.op)},
                       {"algo", traceRow->algo},
                       {"bytes", traceRow->bytes},
                       {"measured_us", traceRow->measuredUs},
                       {"sim_us", traceRow->simUs},
                       {"sim_err_pct", traceRow->simErrPct}}},
                     {"measured_trace", measuredTrace.empty() ? json(nullptr) : json(measuredTrace)},
                     {"measured_op", trace->measuredOp ? json(*trace->measuredOp) : json(nullptr)},
                     {"note", trace->note},
                     {"steps", steps}};
  }
  return root.dump(1) + "\n";
}

std::string formatValidationTable(const ValidationResult& result) {
  std::string out = strprintf("%-13s %-17s %11s %7s %13s %13s %13s %9s %9s\n", "op", "algo", "bytes", "ch x ch",
                              "measured(us)", "sim(us)", "closed(us)", "sim err%", "cf err%");
  for (const auto& r : result.rows) {
    const std::string shape = std::to_string(r.request.gen.chunks) + "x" + std::to_string(r.request.gen.channels) +
                              (r.request.inPlace ? "i" : "");
    const std::string closed = r.closedUs ? strprintf("%.2f", *r.closedUs) : "-";
    const std::string closedErr = r.closedErrPct ? strprintf("%+.1f", *r.closedErrPct) : "-";
    out += strprintf("%-13s %-17s %11llu %7s %13.2f %13.2f %13s %+9.1f %9s\n", toString(r.request.spec.op),
                     r.algo.c_str(), static_cast<unsigned long long>(r.bytes), shape.c_str(), r.measuredUs, r.simUs,
                     closed.c_str(), r.simErrPct, closedErr.c_str());
  }
  return out;
}

}  // namespace mk

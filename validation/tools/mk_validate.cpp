// mk-validate — predict every measured collective of the resident kernel with the simulator and the closed form,
// from a hardware profile, and report how far the predictions are (docs/validation.md).
//
//   mk-validate --profile p.json [--cluster h200x2] [--op allreduce,...] [--algo ...] [--max-median-err X]
//               [--max-max-err Y] [--report DIR] [--trace-record OP:ALGO:BYTES [--measured-trace t.json [--measured-op
//               N]]]
//               [-j N] [--json out.json] [--skip-bad] files...
//   mk-validate --fused-nodes MANIFEST [--max-median-err-fused X] [-j N]  (the fused operators across nodes)
//
// Exit codes (mk/util/cli.hpp): 0 success, 1 a gate failed (the simulator's median error above --max-median-err,
// its largest above --max-max-err) or a
// simulation process died, 2 bad input (one line on stderr, nothing written).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/io/output_paths.hpp"
#include "mk/schedule/io.hpp"
#include "mk/sim/replay.hpp"
#include "mk/topology/topology.hpp"
#include "mk/util/build_commit.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/size.hpp"
#include "mk/validation/kernel_records.hpp"
#include "mk/validation/prediction_cache.hpp"
#include "mk/validation/report_dir.hpp"
#include "mk/validation/validate.hpp"
#include "mk/validation/validate_fused_nodes.hpp"
#include "mk/validation/validate_layered.hpp"

#ifndef MK_REPORT_SCRIPT
#define MK_REPORT_SCRIPT "validation_report.py"
#endif

namespace {

namespace fs = std::filesystem;

constexpr const char* kTool = "mk-validate";
/// Written into every report directory: only a directory holding it may be replaced by a new report.
constexpr const char* kReportMarker = ".mk-validate-report";

struct Options {
  std::string profile;
  bool datasheet = false;
  std::string cluster;
  std::vector<std::string> ops, algos;
  std::optional<double> maxMedianErr;
  std::optional<double> maxMaxErr;
  std::optional<double> maxMedianErrNccl;
  std::optional<double> maxMedianErrFused;
  std::string reportDir;
  std::string traceRecord;
  std::string measuredTrace;
  std::optional<uint64_t> measuredOp;
  unsigned jobs = 2;
  std::string cache = mk::PredictionCache::defaultDir();
  std::string jsonOut;
  bool skipBad = false;
  std::string python = "/usr/bin/python3";
  std::string script;
  std::vector<std::string> files;
  std::string fusedNodes;
  mk::cli::GuardArgs guard;
};

[[noreturn]] void bad(const std::string& msg) { throw mk::Error(mk::ErrorCode::InvalidArgument, msg); }
[[noreturn]] void ioError(const std::string& msg) { throw mk::Error(mk::ErrorCode::IoError, msg); }

void checkReportDir(const std::string& dir) { mk::report::checkReportDir("--report", dir, kReportMarker, kTool); }

/// "allreduce:auto:one-shot:64KiB" -> op, algo (may hold ':'), bytes.
struct TraceSelector {
  std::string op, algo;
  uint64_t bytes = 0;
};
TraceSelector parseTraceRecord(const std::string& text) {
  const auto first = text.find(':');
  const auto last = text.rfind(':');
  if (first == std::string::npos || first == last)
    bad("bad --trace-record '" + text + "': expected OP:ALGO:BYTES, e.g. allreduce:ring:64KiB");
  TraceSelector t;
  t.op = text.substr(0, first);
  t.algo = text.substr(first + 1, last - first - 1);
  if (t.op.empty() || t.algo.empty()) bad("bad --trace-record '" + text + "': expected OP:ALGO:BYTES");
  t.bytes = mk::parseSize(text.substr(last + 1));
  return t;
}

/// The record whose trace the report shows: the selected one, or the one the simulator is furthest from.
const mk::ValidationRow& traceRow(const mk::ValidationResult& res, const std::optional<TraceSelector>& sel) {
  if (!sel) {
    return *std::max_element(res.rows.begin(), res.rows.end(), [](const auto& a, const auto& b) {
      return std::fabs(a.simErrPct) < std::fabs(b.simErrPct);
    });
  }
  const mk::ValidationRow* generatorMatch = nullptr;
  for (const auto& r : res.rows) {
    if (mk::toString(r.request.spec.op) != sel->op || r.bytes != sel->bytes) continue;
    if (r.algo == sel->algo) return r;
    if (generatorMatch == nullptr && mk::toString(r.request.spec.algo) == sel->algo) generatorMatch = &r;
  }
  if (generatorMatch == nullptr)
    bad("--trace-record " + sel->op + ":" + sel->algo + ":" + std::to_string(sel->bytes) +
        ": no validated record has that op, algorithm and size");
  return *generatorMatch;
}

std::string traceFileName(const mk::ValidationRow& r) {
  std::string algo = r.algo;
  std::replace(algo.begin(), algo.end(), ':', '-');
  return std::string("trace-") + mk::toString(r.request.spec.op) + "-" + algo + "-" + std::to_string(r.bytes) + ".json";
}

void printProvenance(const Options& o, const mk::Profile& p, const mk::ProfileProvenance& prov,
                     const std::string& honesty) {
  if (o.datasheet) {
    std::printf("profile: datasheet defaults of the cluster (%s)\n", p.source.c_str());
  } else {
    std::printf("profile: %s (%s)\n", o.profile.c_str(), p.source.c_str());
    std::printf("provenance: tool %s; date %s; commit %s; system %s\n", prov.tool.empty() ? "-" : prov.tool.c_str(),
                prov.date.empty() ? "-" : prov.date.c_str(), prov.commit.empty() ? "-" : prov.commit.c_str(),
                prov.system.empty() ? "-" : prov.system.c_str());
    for (const auto& m : prov.measurements) std::printf("  fitted from %s\n", m.c_str());
  }
  std::printf("honesty: %s\n", honesty.c_str());
}

/// The fused line's summary (the closed form's, then the simulator's "validation fused: ..."); true when `gate` failed.
bool printFusedSummary(const mk::FusedValidation& fused, std::optional<double> gate) {
  if (!fused.filled.empty()) {
    std::string names;
    for (const auto& f : fused.filled) names += (names.empty() ? "" : ", ") + f;
    std::printf("fused: profile %s from the datasheet (not in the profile)\n", names.c_str());
  }
  std::printf("%s\n", mk::formatSummaryLine(fused.closed, "fused closed form").c_str());
  std::printf("%s\n", mk::formatSummaryLine(fused.sim, "validation fused").c_str());
  if (!gate || fused.sim.medianAbsPct <= *gate) return false;
  std::fflush(stdout);
  std::fprintf(stderr,
               "%s: gate failed: the fused line's median absolute error %.2f %% exceeds --max-median-err-fused %g %%\n",
               kTool, fused.sim.medianAbsPct, *gate);
  return true;
}

/// --fused-nodes MANIFEST: the manifest's chain (its calibration files fitted, its gated records replayed), the fit
/// and the fused table, ending with the "validation fused: ..." line.
int runFusedNodes(const Options& o) {
  mk::ValidationOptions vo;
  vo.jobs = o.jobs;
  vo.skipBad = o.skipBad;
  vo.maxMemory = o.guard.maxMemory();
  mk::PredictionCache cache(o.cache == "none" ? "" : o.cache);
  vo.cache = &cache;
  const mk::FusedNodesValidation v = mk::validateFusedNodes(o.fusedNodes, vo);
  const mk::FusedNodesManifest& m = v.manifest;
  if (v.fused.rows.empty())
    bad("--fused-nodes " + o.fusedNodes + ": no fused record of " + m.path +
        "'s gated files was predicted: a gate that checks nothing must not pass");
  std::printf(
      "mk-validate: --fused-nodes %s: data %s: %zu calibration file(s) fitted over the %s datasheet, %zu gated "
      "file(s) on %s, %u job(s)\n",
      o.fusedNodes.c_str(), m.dir.c_str(), m.calibration.size(), m.base.c_str(), m.gated.size(), m.topology.c_str(),
      o.jobs);
  std::printf("regime: %s\n", m.regime.c_str());
  std::fputs(mk::formatFitReport(v.fit).c_str(), stdout);
  std::fputs(mk::formatFusedTable(v.fused).c_str(), stdout);
  for (const auto& s : v.fused.skipped) std::printf("skipped fused: %s\n", s.reason.c_str());
  return printFusedSummary(v.fused, o.maxMedianErrFused) ? mk::cli::kExitFailed : 0;
}

int run(const Options& o, const std::string& command) {
  // ---- everything that can be checked before the simulations ----
  mk::checkDistinctOutputs({{"--report", o.reportDir, mk::OutputKind::Folder},
                            {"--json", o.jsonOut, mk::OutputKind::File},
                            {"--cache", o.cache == "none" ? "" : o.cache, mk::OutputKind::Folder}});
  if (o.datasheet == !o.profile.empty()) bad("give exactly one of --profile p.json and --datasheet");
  checkReportDir(o.reportDir);
  std::optional<TraceSelector> sel;
  if (!o.traceRecord.empty()) sel = parseTraceRecord(o.traceRecord);
  if (!o.measuredTrace.empty() && !sel)
    bad("--measured-trace needs --trace-record OP:ALGO:BYTES (which record the trace belongs to)");
  if (o.measuredOp && o.measuredTrace.empty()) bad("--measured-op needs --measured-trace");
  if ((sel || !o.measuredTrace.empty()) && o.reportDir.empty())
    bad("--trace-record and --measured-trace go into the report: give --report DIR");
  std::vector<std::string> inputs = o.files;
  inputs.insert(inputs.end(), {o.profile, o.cluster, o.measuredTrace, o.script});
  mk::checkOutputPath("--json", o.jsonOut, inputs);
  std::string measuredJson;
  if (!o.measuredTrace.empty()) measuredJson = mk::readFile(o.measuredTrace);
  if (!o.reportDir.empty()) {
    std::error_code ec;
    if (!fs::exists(o.script, ec)) ioError("--report: report script " + o.script + " not found (see --report-script)");
    if (::access(o.python.c_str(), X_OK) != 0)
      ioError("--report: " + o.python + " is not an executable (see --python)");
  }

  const std::vector<mk::MeasurementFile> files = mk::loadMeasurementFiles(o.files);
  // Kernel records are not validated here, but one the census cannot read is bad input (exit 2), as in mk-plan.
  for (std::size_t i = 0; i < files.size(); ++i) (void)mk::kernelRecords(files[i], o.files[i]);
  mk::ValidationOptions vo;
  vo.cluster = mk::resolveCluster(files, o.files, o.cluster);
  vo.ops = o.ops;
  vo.algos = o.algos;
  vo.jobs = o.jobs;
  vo.skipBad = o.skipBad;
  vo.maxMemory = o.guard.maxMemory();
  mk::PredictionCache cache(o.cache == "none" ? "" : o.cache);
  vo.cache = &cache;

  mk::ValidationContext ctx;
  ctx.command = command;
  ctx.commit = mk::buildCommit();
  ctx.maxMedianErrPct = o.maxMedianErr;
  ctx.maxMaxErrPct = o.maxMaxErr;
  ctx.maxMedianErrNcclPct = o.maxMedianErrNccl;
  if (o.datasheet) {
    ctx.profile = mk::defaultProfile(mk::loadTopology(vo.cluster));
    ctx.provenance.tool = "defaultProfile";
    ctx.provenance.system = vo.cluster;
  } else {
    ctx.profile = mk::loadProfileFor(o.profile, mk::loadTopology(vo.cluster), &ctx.provenance);
    ctx.profilePath = o.profile;
    mk::checkProfileIndependence(ctx.provenance, o.profile, files, o.files, vo);
  }
  ctx.honesty = mk::honestyStatement(ctx.profilePath, ctx.profile, ctx.provenance);

  std::printf("mk-validate: %zu file(s), cluster %s%s, %u job(s)\n", files.size(), vo.cluster.c_str(),
              o.cluster.empty() ? " (from the files' system)" : "", o.jobs);
  printProvenance(o, ctx.profile, ctx.provenance, ctx.honesty);
  std::fflush(stdout);

  const mk::ValidationResult res = mk::validateMeasurements(files, o.files, ctx.profile, vo);
  // The fused operators' records: their own line (a fused record is not a collective: it stays out of the rows).
  const mk::FusedValidation fused = mk::validateFused(files, o.files, vo.cluster, ctx.profile, vo);
  if (o.maxMedianErrFused && fused.rows.empty())
    bad("--max-median-err-fused: no fused record (impl \"mkernel\", op gemm-rs, ag-gemm or gemm-ar) was predicted: a "
        "gate that checks nothing must not pass");
  if (res.rows.empty() && fused.rows.empty())
    bad("no record to validate (" + std::to_string(res.ignored) + " of other kinds ignored, " +
        std::to_string(res.filtered) + " left out by --op/--algo, " + std::to_string(res.skipped.size()) +
        " skipped): a gate that checks nothing must not pass");
  if (res.rows.empty() && (o.maxMedianErr || o.maxMaxErr || !o.reportDir.empty()))
    bad("--max-median-err, --max-max-err and --report judge the collective records, and none was validated (" +
        std::to_string(fused.rows.size()) + " fused record(s) are on their own line: --max-median-err-fused)");
  if (!o.reportDir.empty() && sel) (void)traceRow(res, sel);  // an unknown record is bad input: fail before writing
  // The layered baseline: every impl "nccl" record, predicted with the nccl-* family (its own line below).
  const mk::LayeredValidation layered = mk::validateLayered(files, o.files, vo.cluster, ctx.profile, o.jobs, &cache);
  std::printf("mk-validate: %zu distinct predictions for %zu records, %zu of them from the cache%s%s\n",
              res.simulations, res.rows.size(), res.fromCache, cache.enabled() ? " " : " (off)",
              cache.enabled() ? cache.file().c_str() : "");
  if (o.maxMedianErrNccl && layered.rows.empty())
    bad("--max-median-err-nccl: no impl \"nccl\" record to validate: a gate that checks nothing must not pass");
  if (!layered.rows.empty()) ctx.layered = &layered;
  if (!fused.rows.empty() || !fused.skipped.empty()) ctx.fused = &fused;
  ctx.maxMedianErrFusedPct = o.maxMedianErrFused;

  std::fputs(mk::formatValidationTable(res).c_str(), stdout);
  for (const auto& f : res.files)
    std::printf(
        "file %s: %zu records, %zu validated, %zu ignored (not mkernel collectives), %zu left out by "
        "--op/--algo, %zu skipped\n",
        f.name.c_str(), f.records, f.validated, f.ignored, f.filtered, f.skipped);
  for (const auto& s : res.skipped) std::printf("skipped: %s\n", s.reason.c_str());
  if (ctx.fused != nullptr) std::fputs(mk::formatFusedTable(fused).c_str(), stdout);
  for (const auto& s : fused.skipped) std::printf("skipped fused: %s\n", s.reason.c_str());

  // ---- outputs, all or nothing: the report in a temporary directory and --json in a temporary file, then the
  // report moved into place, then --json ----
  std::string json;
  mk::report::StagedReport report("--report", o.reportDir, kReportMarker, kTool);
  mk::OutputSet outputs;
  std::string traceName;
  if (report.active()) {
    const mk::ValidationRow& row = traceRow(res, sel);
    const mk::Regenerated regen = mk::regenerate(row, vo.cluster);
    mk::sim::SimOptions so;
    so.linkLoad = false;
    const mk::sim::Prediction p = mk::sim::predict(regen.schedule, regen.topo, ctx.profile, so);
    const std::string title = row.file + " records[" + std::to_string(row.index) +
                              "]: " + mk::toString(row.request.spec.op) + " " + row.algo + " " +
                              std::to_string(row.bytes) + " B";
    const mk::SideBySide sbs =
        mk::sideBySideTrace(regen.schedule, p, measuredJson, o.measuredTrace, o.measuredOp, title);
    traceName = traceFileName(row);
    json = mk::validationToJson(res, ctx, &sbs, &row, traceName, o.measuredTrace);
    report.write({{"validation.json", json}, {traceName, sbs.json}});
    report.render(o.python, o.script, "validation.json");
    std::printf("trace: %s (%s)\n", traceName.c_str(), sbs.note.c_str());
  } else {
    json = mk::validationToJson(res, ctx);
  }
  outputs.stage("--json", o.jsonOut, json);
  report.install();
  outputs.commit();
  if (!o.jsonOut.empty()) std::printf("wrote %s\n", o.jsonOut.c_str());
  if (!o.reportDir.empty()) std::printf("wrote %s/index.html\n", o.reportDir.c_str());

  std::printf("%s\n", mk::formatSummaryLine(res.closed, "closed form").c_str());
  bool failed = false;
  if (!layered.rows.empty()) {
    for (const auto& r : layered.rows)
      std::printf("nccl %s records[%zu] %s %llu B: measured %.2f us, %s %.2f us (GPU %.2f, %u launch(es)), %+.2f %%\n",
                  r.file.c_str(), r.index, r.op.c_str(), static_cast<unsigned long long>(r.bytes), r.measuredUs,
                  r.choice.c_str(), r.predictedUs, r.gpuUs, r.launchesPerOp, r.errPct);
    std::printf("%s\n", mk::formatSummaryLine(layered.stats, "nccl").c_str());
    if (o.maxMedianErrNccl && layered.stats.medianAbsPct > *o.maxMedianErrNccl) {
      std::fflush(stdout);
      std::fprintf(
          stderr,
          "%s: gate failed: the nccl line's median absolute error %.2f %% exceeds --max-median-err-nccl %g %%\n", kTool,
          layered.stats.medianAbsPct, *o.maxMedianErrNccl);
      failed = true;
    }
  }
  if (!fused.rows.empty()) failed = printFusedSummary(fused, o.maxMedianErrFused) || failed;
  if (o.maxMedianErr && res.sim.medianAbsPct > *o.maxMedianErr) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "%s: gate failed: the simulator's median absolute error %.2f %% exceeds --max-median-err %g %%\n",
                 kTool, res.sim.medianAbsPct, *o.maxMedianErr);
    failed = true;
  }
  if (o.maxMaxErr && res.sim.maxAbsPct > *o.maxMaxErr) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "%s: gate failed: the simulator's largest absolute error %.2f %% exceeds --max-max-err %g %%\n", kTool,
                 res.sim.maxAbsPct, *o.maxMaxErr);
    failed = true;
  }
  // The last line, always: scripts and the CI gate read it.
  std::printf("%s\n", mk::formatSummaryLine(res.sim).c_str());
  return failed ? mk::cli::kExitFailed : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.script = mk::report::defaultScript("validation_report.py", MK_REPORT_SCRIPT);
  CLI::App app{
      "mk-validate: predict every measured collective of the resident kernel (records with impl \"mkernel\" and op\n"
      "allreduce, allgather, reducescatter, broadcast or alltoall) with the SimGrid simulator (exact mode) and the\n"
      "closed form, from a hardware profile, and compare. The schedule is regenerated from the record's own fields\n"
      "(op, algo -- \"auto:X\" means X --, dtype, ranks, count, redop, chunks, channels, inplace). Other records\n"
      "(nccl baselines, calib-* micro-benchmarks, enqueue-to-first-step) are counted and ignored.\n\n"
      "Error of a prediction: (predicted - measured) / measured * 100. Prints a table (op, algo, bytes, chunks x\n"
      "channels, measured, simulated, closed form, both errors) and ENDS with exactly one line\n"
      "  validation: n=<N> median_abs_err_pct=<x> p90_abs_err_pct=<y> max_abs_err_pct=<z>\n"
      "over the SIMULATOR's errors (the closed form's are on the line before). --max-median-err gates that\n"
      "median. p90 interpolates linearly between order statistics.\n\n"
      "Honesty: the profile must come from micro-benchmarks (mk-calibrate reads only calib-* records); a profile\n"
      "whose provenance lists a file that holds a record validated here is refused. The report says how the\n"
      "profile was obtained.\n\n"
      "  mk-validate --profile p.json validation/data/measured/2026-11-29-h200x2-*.json\n"
      "  mk-validate --profile p.json --op allreduce --max-median-err 10 --report rep f.json\n"
      "  mk-validate --profile p.json --report rep --trace-record allreduce:ring:1MiB --measured-trace t.json "
      "f.json\n\n"
      "Exit codes: 0 success, 1 the gate failed or a simulation process died, 2 bad input (a file breaking the\n"
      "measurement contract, a record whose schedule cannot be regenerated, a profile missing a parameter, an\n"
      "unwritable output, a record above --max-memory): one line on stderr and nothing written; 5 out of memory.\n"
      "Details: docs/validation.md.",
      kTool};
  app.add_option("--profile", o.profile, "hardware profile (mkernel.profile.v1), normally from mk-calibrate");
  app.add_flag("--datasheet", o.datasheet,
               "use the cluster's datasheet defaults (mk::defaultProfile) instead of --profile: shows what the "
               "uncalibrated model gets wrong");
  app.add_option("--cluster", o.cluster,
                 "preset (h200x2, dgx-h100, dgx-h200) or topology JSON the records ran on (default: the preset whose "
                 "GPU model and count match every file's system block; an error when none or several do)");
  app.add_option("--op", o.ops, "only these collectives (comma-separated: allreduce,allgather,...)")->delimiter(',');
  app.add_option("--algo", o.algos,
                 "only these algorithms (comma-separated); \"ring\" matches ring and auto:ring, \"auto:ring\" only the "
                 "latter")
      ->delimiter(',');
  app.add_option("--max-median-err", o.maxMedianErr,
                 "gate: exit 1 when the simulator's median absolute error (percent) exceeds this")
      ->check(mk::cli::percentThreshold());
  app.add_option("--max-max-err", o.maxMaxErr,
                 "gate: exit 1 when the simulator's largest absolute error (percent) over the records exceeds this")
      ->check(mk::cli::percentThreshold());
  app.add_option("--max-median-err-nccl", o.maxMedianErrNccl,
                 "gate: exit 1 when the median absolute error (percent) of the nccl line (impl \"nccl\" records "
                 "predicted with the nccl-* family, docs/algorithms-nccl.md) exceeds this")
      ->check(mk::cli::percentThreshold());
  app.add_option("--max-median-err-fused", o.maxMedianErrFused,
                 "gate: exit 1 when the median absolute error (percent) of the fused line (gemm-rs, ag-gemm, gemm-ar "
                 "records of our engine, predicted by the fused model with the options they ran) exceeds this")
      ->check(mk::cli::percentThreshold());
  app.add_option(
      "--report", o.reportDir,
      "an HTML folder: write DIR/index.html with PNG plots (measured vs predicted time and error over size per op and "
      "algorithm, via --python with matplotlib), the table, the profile and its provenance, "
      "DIR/validation.json, and one Perfetto trace DIR/trace-<op>-<algo>-<bytes>.json. DIR must be new, "
      "empty, or a previous report (replaced whole; written in a temporary directory, then renamed)");
  app.add_option("--trace-record", o.traceRecord,
                 "OP:ALGO:BYTES of the record whose per-step trace the report shows (BYTES as 64KiB or 65536); "
                 "default: the record with the largest simulator error");
  app.add_option("--measured-trace", o.measuredTrace,
                 "a mk-bench --trace file of that record: its steps are shown next to the predicted ones "
                 "(pids \"measured rank r\" / \"simulated rank r\")");
  app.add_option("--measured-op", o.measuredOp,
                 "which op of --measured-trace (mk-bench traces one op per size, in sweep order; default: the only "
                 "op whose steps are the record's schedule)");
  app.add_option("-j,--jobs", o.jobs, "simulations run at once (each in its own process)")->capture_default_str();
  app.add_option("--cache", o.cache,
                 "keep predictions between runs of this executable in DIR (a hit is what a fresh simulation "
                 "gives; a rebuilt tool starts over); none: simulate everything")
      ->capture_default_str();
  mk::cli::addGuardOptions(app, o.guard);
  app.add_option("--json", o.jsonOut, "write every row, the summary and the profile as JSON (mkernel.validation.v1)");
  app.add_flag("--skip-bad", o.skipBad,
               "records whose schedule cannot be regenerated are skipped, counted and listed instead of failing");
  app.add_option("--python", o.python, "python with matplotlib for --report")->capture_default_str();
  app.add_option("--report-script", o.script, "the report generator")->capture_default_str();
  app.add_option("--fused-nodes", o.fusedNodes,
                 "instead of files and --profile: the fused operators across nodes of a manifest (mkernel.fused-"
                 "validation.v1, e.g. validation/data/fused-validation/*.json) naming a measurement directory, its "
                 "calibration files, gated records, topology and base preset: the "
                 "profile fitted as mk-calibrate does, then the gated records' fused table, ending with the line "
                 "\"validation fused: n=... median_abs_err_pct=...\" (docs/validation.md)");
  CLI::Option* files = app.add_option("files", o.files, "measurement files (mkernel.measurement.v1)");
  // Required unless --fused-nodes: a required positional also keeps --op / --algo from swallowing the files.
  if (std::none_of(argv + 1, argv + argc, [](const char* a) { return std::string(a).rfind("--fused-nodes", 0) == 0; }))
    files->required();
  if (int rc = mk::cli::parse(app, argc, argv, kTool); rc != mk::cli::kContinue) return rc;
  if (int rc = mk::cli::requirePositive(app, kTool, {{"--jobs", o.jobs}}); rc != mk::cli::kContinue) return rc;
  if (!o.fusedNodes.empty()) {
    for (const char* opt :
         {"files", "--profile", "--datasheet", "--cluster", "--op", "--algo", "--max-median-err", "--max-max-err",
          "--max-median-err-nccl", "--report", "--trace-record", "--measured-trace", "--measured-op", "--json"})
      if (app.count(opt) > 0) {
        std::fprintf(stderr,
                     "%s: error: --fused-nodes runs its manifest's own chain (profile, records, topology): %s does "
                     "not apply (--max-median-err-fused, -j, --cache, --skip-bad, --max-memory do)\n",
                     kTool, opt);
        return mk::cli::kExitBadInput;
      }
    return mk::cli::run(kTool, [&] { return runFusedNodes(o); });
  }
  const std::string command = mk::cli::commandLine(kTool, argc, argv);
  return mk::cli::run(kTool, [&] { return run(o, command); });
}

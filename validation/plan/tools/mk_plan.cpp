// mk-plan — capacity planning: how long a training step of a model takes on a cluster from 8 to 8192+ GPUs, where
// the time goes, what bounds it, what-ifs on the network, and how far each number can be trusted
// (docs/planner.md).
//
//   mk-plan --workload llama3-70b --cluster dgx-h100 --gpus 64:8192 --report DIR
//
// Exit codes (mk/util/cli.hpp): 0 success, 1 a simulation process died (a bug), 2 bad input (one line on stderr,
// nothing written).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/io/output_paths.hpp"
#include "mk/plan/plan_output.hpp"
#include "mk/plan/planner.hpp"
#include "mk/plan/search.hpp"
#include "mk/plan/shard.hpp"
#include "mk/plan/step_check.hpp"
#include "mk/schedule/io.hpp"
#include "mk/util/build_commit.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/cli_convention.hpp"
#include "mk/util/size.hpp"
#include "mk/validation/prediction_cache.hpp"
#include "mk/validation/report_dir.hpp"
#include "mk/workload/model_shape.hpp"
#include "mk/workload/workload.hpp"
#include "mk/workload/workload_import.hpp"

#ifndef MK_PLAN_REPORT_SCRIPT
#define MK_PLAN_REPORT_SCRIPT "plan_report.py"
#endif
#ifndef MK_DEFAULT_PROFILE
#define MK_DEFAULT_PROFILE ""
#endif
#ifndef MK_MEASURED_DIR
#define MK_MEASURED_DIR ""
#endif

namespace {

namespace fs = std::filesystem;

constexpr const char* kTool = "mk-plan";
/// Written into every report directory: only a directory holding it may be replaced by a new report.
constexpr const char* kReportMarker = ".mk-plan-report";

struct Options {
  std::string workload = "llama3-70b";
  std::string layoutFile;
  std::string hfConfig, megatronArgs;  ///< --hf-config FILE, --megatron-args FILE|STRING
  std::string recipe;                  ///< --recipe FILE.yaml (Megatron-LM --yaml-cfg or NeMo 1.x)
  std::optional<uint32_t> tp, pp, ep, zero, microBatch, virtualStages;
  std::optional<uint32_t> cp;
  std::optional<uint64_t> globalBatch, seq;
  std::string sp, ppSchedule, recompute, recomputeModules, bucket;
  std::string cluster = mk::kDefaultCluster;
  std::string gpus = "8:4096";
  std::string profile;
  bool datasheet = false;
  std::vector<std::string> whatIfs;
  std::string tokenBudget = "1T";
  std::optional<double> gpuMemoryGB;
  std::string measured;
  std::string fusedValidation;
  std::string cache = mk::PredictionCache::defaultDir();
  uint64_t simBudget = 4000000;
  mk::cli::GuardArgs guard;  ///< --max-memory only: mk-plan prints its progress always
  unsigned jobs = 2;
  std::string reportDir, jsonOut, statsOut, kernelsOut;
  std::string python = "/usr/bin/python3";
  std::string script;
  bool listWorkloads = false, quiet = false, brief = false, checkSteps = false;
  std::string shard;                    ///< --shard i/n | auto
  std::vector<std::string> mergeFiles;  ///< mk-plan merge FILES: the shards' plan.json
  std::vector<std::string> planArgs;    ///< the options that decide the plan (planOptions)
  bool search = false;                  ///< --search: rank the layouts (search.hpp)
  std::size_t searchTop = 5;            ///< --search-top K
  std::string searchSpace = "full";     ///< --search-space
  std::string searchCsv;                ///< --search-csv FILE
};

[[noreturn]] void bad(const std::string& msg) { throw mk::Error(mk::ErrorCode::InvalidArgument, msg); }

/// "1T", "15T", "2.5e12", "800B": a token count with decimal K/M/B/T suffixes.
double parseTokens(const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    used = 0;
  }
  double mult = 1;
  const std::string rest = used ? text.substr(used) : "";
  if (rest == "K")
    mult = 1e3;
  else if (rest == "M")
    mult = 1e6;
  else if (rest == "B" || rest == "G")
    mult = 1e9;
  else if (rest == "T")
    mult = 1e12;
  else if (!rest.empty())
    used = 0;
  if (used == 0 || !std::isfinite(v) || v <= 0)
    bad("--token-budget '" + text + "': expected a positive number of tokens, e.g. 15T, 800B, 2e12");
  return v * mult;
}

bool onOff(const std::string& option, const std::string& v) {
  if (v == "on" || v == "true" || v == "1") return true;
  if (v == "off" || v == "false" || v == "0") return false;
  bad(option + " '" + v + "': expected on or off");
}

/// The workload of the command line: a preset or file, then --layout, then the single-field options.
mk::Workload buildWorkload(const Options& o) {
  mk::Workload w = mk::loadWorkload(o.workload);
  std::vector<std::string> ignored;
  if (!o.hfConfig.empty()) mk::applyHfConfig(w, mk::readFile(o.hfConfig), o.hfConfig, ignored);
  if (!o.megatronArgs.empty()) {
    std::error_code ec;
    const bool file = fs::is_regular_file(o.megatronArgs, ec);
    if (!file && o.megatronArgs.rfind("--", 0) != 0)
      bad("--megatron-args " + o.megatronArgs + ": no such file, and not an argument list (--num-layers ...)");
    mk::applyMegatronArgs(w, file ? mk::readFile(o.megatronArgs) : o.megatronArgs,
                          file ? o.megatronArgs : std::string("--megatron-args"), ignored);
  }
  if (!o.recipe.empty()) mk::applyRecipe(w, mk::readFile(o.recipe), o.recipe, ignored);
  if (!ignored.empty()) {
    std::string list;
    for (const auto& k : ignored) list += (list.empty() ? "" : ", ") + k;
    std::fprintf(stderr, "mk-plan: note: read and ignored (they do not change the step): %s\n", list.c_str());
  }
  if (!o.layoutFile.empty()) mk::applyLayoutJson(w, mk::readFile(o.layoutFile), o.layoutFile);
  mk::ParallelLayout& l = w.layout;
  if (o.tp) l.tp = *o.tp;
  if (o.pp) l.pp = *o.pp;
  if (o.ep) l.ep = *o.ep;
  if (o.cp) l.cp = *o.cp;
  if (o.zero) l.zero = *o.zero;
  if (o.virtualStages) l.virtualStages = *o.virtualStages;
  if (!o.sp.empty()) l.sp = onOff("--sp", o.sp);
  if (!o.ppSchedule.empty()) {
    if (o.ppSchedule == "1f1b")
      l.schedule = mk::PipelineSchedule::OneFOneB;
    else if (o.ppSchedule == "interleaved")
      l.schedule = mk::PipelineSchedule::Interleaved;
    else if (o.ppSchedule == "gpipe")
      l.schedule = mk::PipelineSchedule::GPipe;
    else
      bad("--pp-schedule '" + o.ppSchedule + "': expected 1f1b, interleaved or gpipe");
  }
  if (!o.bucket.empty()) l.bucketBytes = mk::parseSize(o.bucket);
  if (o.microBatch) w.training.microBatch = *o.microBatch;
  if (o.globalBatch) w.training.globalBatch = *o.globalBatch;
  if (o.seq) w.training.seq = *o.seq;
  if (!o.recompute.empty()) {
    if (o.recompute == "none")
      w.training.recompute = mk::Recompute::None;
    else if (o.recompute == "full")
      w.training.recompute = mk::Recompute::Full;
    else if (o.recompute == "selective")
      w.training.recompute = mk::Recompute::Selective;
    else
      bad("--recompute '" + o.recompute + "': expected none, full or selective");
    w.training.recomputeModules = {};
    if (w.training.recompute == mk::Recompute::Selective && o.recomputeModules.empty())
      w.training.recomputeModules.coreAttn = true;  // Megatron-LM's default
  }
  if (!o.recomputeModules.empty()) {
    if (w.training.recompute != mk::Recompute::Selective)
      bad("--recompute-modules needs --recompute selective (or training.recompute \"selective\")");
    w.training.recomputeModules = {};
    std::size_t at = 0;
    while (at <= o.recomputeModules.size()) {
      const std::size_t comma = std::min(o.recomputeModules.find(',', at), o.recomputeModules.size());
      const std::string name = o.recomputeModules.substr(at, comma - at);
      if (!mk::setRecomputeModule(w.training.recomputeModules, name))
        bad("--recompute-modules '" + name + "': expected a comma-separated list of core_attn, mlp, moe_act, norms");
      at = comma + 1;
    }
  }
  mk::validateWorkload(w);
  return w;
}

void listWorkloads() {
  for (const auto& name : mk::workloadPresets()) {
    const mk::Workload w = mk::workloadPreset(name);
    const auto& m = w.model;
    std::printf(
        "%-16s layers %u, hidden %llu, ffn %llu, heads %u, kv heads %u, vocab %llu%s\n", name.c_str(), m.layers,
        static_cast<unsigned long long>(m.hidden), static_cast<unsigned long long>(m.ffn), m.heads, m.kvHeads,
        static_cast<unsigned long long>(m.vocab),
        m.moe ? (", " + std::to_string(m.moe->experts) + " experts, top " + std::to_string(m.moe->topK)).c_str() : "");
    std::printf("%-16s seq %llu, global batch %llu x micro %u; layout tp %u pp %u ep %u%s zero %u\n", "",
                static_cast<unsigned long long>(w.training.seq),
                static_cast<unsigned long long>(w.training.globalBatch), w.training.microBatch, w.layout.tp,
                w.layout.pp, w.layout.ep, w.layout.sp ? " sp" : "", w.layout.zero);
    const mk::ParamCount params = mk::countParams(m);
    std::printf("%-16s parameters %.1fB, %.1fB active per token\n", "", params.total / 1e9, params.active / 1e9);
    std::printf("%-16s source: %s\n", "", mk::workloadPresetSource(name).c_str());
  }
}

int run(const Options& o, const std::string& command) {
  if (o.listWorkloads) {
    listWorkloads();
    return 0;
  }
  // ---- everything that can be checked before minutes of simulation ----
  mk::checkDistinctOutputs({{"--report", o.reportDir, mk::OutputKind::Folder},
                            {"--json", o.jsonOut, mk::OutputKind::File},
                            {"--stats", o.statsOut, mk::OutputKind::File},
                            {"--emit-kernels", o.kernelsOut, mk::OutputKind::File},
                            {"--search-csv", o.searchCsv, mk::OutputKind::File},
                            {"--cache", o.cache == "none" ? "" : o.cache, mk::OutputKind::Folder}});
  if (o.datasheet && !o.profile.empty()) bad("give at most one of --profile p.json and --datasheet");
  mk::plan::PlanInputs in;
  in.workload = buildWorkload(o);
  in.cluster = o.cluster;
  in.gpus = mk::plan::parseGpuCounts(o.gpus);
  for (const auto& w : o.whatIfs) in.whatIfs.push_back(mk::plan::parseWhatIf(w));
  in.tokenBudget = parseTokens(o.tokenBudget);
  in.gpuMemoryGB = o.gpuMemoryGB;
  std::error_code ec;
  if (o.datasheet) {
    in.datasheet = true;
  } else if (!o.profile.empty()) {
    in.profilePath = o.profile;
  } else if (fs::is_regular_file(MK_DEFAULT_PROFILE, ec)) {
    in.profilePath = MK_DEFAULT_PROFILE;
  }
  if (o.measured == "none") {
    in.measuredDir.clear();
  } else if (!o.measured.empty()) {
    if (!fs::is_directory(o.measured, ec)) bad("--measured " + o.measured + ": no such directory");
    in.measuredDir = o.measured;
  } else if (fs::is_directory(MK_MEASURED_DIR, ec)) {
    in.measuredDir = MK_MEASURED_DIR;
  }
  // The fused records' manifests: given, none, or the committed ones unless --measured none (no measurements at
  // all) was asked for.
  if (o.fusedValidation == "none") {
    in.fusedValidationDir.clear();
  } else if (!o.fusedValidation.empty()) {
    if (!fs::is_directory(o.fusedValidation, ec))
      bad("--fused-validation " + o.fusedValidation + ": no such directory");
    in.fusedValidationDir = o.fusedValidation;
  } else if (o.measured != "none" && fs::is_directory(MK_FUSED_VALIDATION_DIR, ec)) {
    in.fusedValidationDir = MK_FUSED_VALIDATION_DIR;
  }
  if (o.checkSteps) {  // the step records of the measurement directory against the planner: no plan
    std::vector<mk::MeasurementFile> files;
    std::vector<std::string> names;
    mk::plan::loadMeasuredDir(in.measuredDir, files, names);
    if (files.empty()) bad("--check-steps: no measurement directory (--measured " + o.measured + ")");
    std::fputs(mk::plan::stepCheckText(mk::plan::checkSteps(files, names)).c_str(), stdout);
    return 0;
  }
  if (o.cache != "none") in.cacheDir = o.cache;
  in.pricer.jobs = o.jobs;
  in.pricer.budgetSteps = o.simBudget;
  in.pricer.maxMemory = o.guard.maxMemory();
  // ---- shards (shard.hpp): what this process plans, or the shards' prices a merge plans with ----
  if (!o.shard.empty()) in.shard = mk::plan::parseShard(o.shard, [](const char* v) { return std::getenv(v); });
  if (in.shard.active() && !o.reportDir.empty())
    bad("--report with --shard: a shard is part of a plan; give --report to mk-plan merge");
  if (in.shard.active() && !o.kernelsOut.empty())
    bad("--emit-kernels with --shard: a shard is part of a plan; give --emit-kernels to mk-plan merge");
  std::vector<std::string> digestParts{mk::buildCommit(), mk::workloadToJson(in.workload, -1), in.cluster,
                                       in.profilePath.empty() ? "" : mk::readFile(in.profilePath)};
  if (fs::is_regular_file(in.cluster, ec)) digestParts.push_back(mk::readFile(in.cluster));
  digestParts.insert(digestParts.end(), o.planArgs.begin(), o.planArgs.end());
  const std::string digest = mk::plan::inputsDigest(digestParts, in.measuredDir, in.fusedValidationDir);
  std::map<std::string, mk::plan::CommPrice> shardPrices, simulated;
  if (!o.mergeFiles.empty()) {
    std::vector<mk::plan::ShardFile> shards;
    for (const std::string& f : o.mergeFiles) shards.push_back(mk::plan::readShardFile(f));
    shardPrices = mk::plan::mergeShardPrices(shards, digest);
    in.pricer.known = &shardPrices;
  }
  if (in.shard.active()) in.pricer.record = &simulated;
  const std::vector<std::string> inputs{o.workload, o.layoutFile, o.cluster, o.profile, o.script};
  mk::checkOutputPath("--json", o.jsonOut, inputs);
  mk::checkOutputPath("--stats", o.statsOut, inputs);
  mk::checkOutputPath("--emit-kernels", o.kernelsOut, inputs);
  mk::checkOutputPath("--search-csv", o.searchCsv, inputs);
  if (!o.searchCsv.empty() && !o.search) bad("--search-csv needs --search");
  if (o.searchSpace != "full" && !o.search) bad("--search-space needs --search");
  mk::report::checkReportDir("--report", o.reportDir, kReportMarker, kTool);
  if (!o.reportDir.empty()) {
    if (!fs::exists(o.script, ec))
      throw mk::Error(mk::ErrorCode::IoError,
                      "--report: report script " + o.script + " not found (see --report-script)");
    if (::access(o.python.c_str(), X_OK) != 0)
      throw mk::Error(mk::ErrorCode::IoError, "--report: " + o.python + " is not an executable (see --python)");
  }

  // ---- the plan, with a progress line on stderr while simulating ----
  auto last = std::chrono::steady_clock::now() - std::chrono::seconds(10);
  in.pricer.onProgress = [&](std::size_t done, std::size_t total, double wallS) {
    const auto now = std::chrono::steady_clock::now();
    if (done != total && now - last < std::chrono::seconds(2)) return;
    last = now;
    std::fprintf(stderr, "mk-plan: %zu of %zu collectives simulated, %.1f s\n", done, total, wallS);
  };
  auto fused = mk::plan::makeFusedOpPricer();
  const auto say = [](const std::string& s) { std::fprintf(stderr, "mk-plan: %s\n", s.c_str()); };
  const mk::plan::PlanResult plan =
      o.search ? mk::plan::searchLayouts(in, *fused,
                                         mk::plan::SearchSettings{
                                             o.searchTop, o.searchSpace == "full" ? mk::plan::SearchSpace::Full
                                                                                  : mk::plan::SearchSpace::Parallelism},
                                         say)
               : mk::plan::runPlan(in, *fused, say);
  if (!o.quiet && plan.search) std::fputs(mk::plan::formatSearchText(*plan.search).c_str(), stdout);
  if (!o.quiet) std::fputs(mk::plan::formatPlanText(plan, o.brief).c_str(), stdout);

  // ---- outputs, all or nothing: the report in a temporary directory and the files in temporaries, then the
  // report moved into place, then the files ----
  std::string json = mk::plan::planToJson(plan, mk::buildCommit());
  if (in.shard.active()) json = mk::plan::addShardSection(json, {"", in.shard, o.planArgs, digest, simulated});
  const std::string stats = mk::plan::planStatsToJson(plan, command);
  const std::string kernels = o.kernelsOut.empty() ? "" : mk::plan::kernelCensusToJson(plan, mk::buildCommit());
  mk::report::StagedReport report("--report", o.reportDir, kReportMarker, kTool);
  mk::OutputSet outputs;
  report.write({{"plan.json", json}, {"run-stats.json", stats}});
  report.render(o.python, o.script, "plan.json");
  outputs.stage("--json", o.jsonOut, json);
  outputs.stage("--stats", o.statsOut, stats);
  outputs.stage("--emit-kernels", o.kernelsOut, kernels);
  outputs.stage("--search-csv", o.searchCsv, plan.search ? mk::plan::searchToCsv(*plan.search) : "");
  report.install();
  outputs.commit();
  if (!o.jsonOut.empty()) std::printf("wrote %s\n", o.jsonOut.c_str());
  if (!o.kernelsOut.empty()) std::printf("wrote %s\n", o.kernelsOut.c_str());
  if (!o.searchCsv.empty()) std::printf("wrote %s\n", o.searchCsv.c_str());
  if (!o.reportDir.empty()) std::printf("report: %s/index.html\n", o.reportDir.c_str());
  std::printf("mk-plan: %zu GPU counts x %zu variants, %zu distinct collectives simulated in %.1f s (%.1f s total)\n",
              in.gpus.size(), plan.variants.size(), plan.stats.distinct, plan.stats.simulationS, plan.stats.wallS);
  return 0;
}

/// The options given that decide the plan, as "--name value" words in the tool's order: every option but the
/// outputs, the shard, and how the run is carried out (jobs, cache, quiet).
std::vector<std::string> planOptions(const CLI::App& app) {
  static const std::set<std::string> runOnly{"--shard", "--json",  "--report", "--stats",  "--emit-kernels",  "--jobs",
                                             "--cache", "--quiet", "--brief",  "--python", "--report-script", "--help"};
  std::vector<std::string> args;
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() == 0 || opt->get_lnames().empty()) continue;
    const std::string name = "--" + opt->get_lnames().front();
    if (runOnly.count(name)) continue;
    if (opt->get_type_size() == 0) {  // a flag
      args.push_back(name);
      continue;
    }
    for (const std::string& v : opt->results()) args.insert(args.end(), {name, v});
  }
  return args;
}

/// "mk-plan merge a.json b.json --json p.json" -> "mk-plan <the shards' plan options> --json p.json", the files in
/// `files`.
int mergeCommandLine(int argc, char** argv, std::vector<std::string>& files, std::vector<std::string>& out) {
  int k = 2;
  for (; k < argc && argv[k][0] != '-'; ++k) files.push_back(argv[k]);
  if (files.empty()) bad("merge: no shard given: mk-plan merge shard-0.json shard-1.json ... [--json plan.json]");
  const mk::plan::ShardFile first = mk::plan::readShardFile(files.front());
  out = {argv[0]};
  out.insert(out.end(), first.args.begin(), first.args.end());
  out.insert(out.end(), argv + k, argv + argc);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.script = mk::report::defaultScript("plan_report.py", MK_PLAN_REPORT_SCRIPT);
  CLI::App app{
      "mk-plan: capacity planning for training a transformer on a GPU cluster, from 8 to 8192+ GPUs.\n\n"
      "For every GPU count (and every what-if variant of the cluster) the training step is lowered to what each\n"
      "GPU runs: forward and backward GEMMs, attention, norms, activations, the loss, the optimizer, ... and the\n"
      "collectives of tensor, pipeline, data and expert parallelism. GEMMs and attention are priced by a GEMM model\n"
      "fitted on our own GEMM measurements, the other kernels by the HBM roofline (marked unmeasured); every distinct\n"
      "collective is simulated once by SimGrid on the cluster at that scale; a step-time model adds overlap, the\n"
      "pipeline bubble and stragglers. Prints one table per variant; --report writes HTML + PNG plots + plan.json.\n"
      "Every number carries its confidence: the measured error of its class of operation, or NOT VALIDATED.\n\n"
      "  mk-plan --workload llama3-70b --cluster dgx-h100 --gpus 64:8192 --report plan\n"
      "  mk-plan --workload llama3-8b --cluster dgx-h200 --gpus 8:4096 --what-if nic-bw=2x --what-if noise=0.05\n"
      "  mk-plan --workload my.json --layout layout.json --cluster cluster.json --gpus 256,512,1024 --json p.json\n"
      "  mk-plan --list-workloads\n\n"
      "Exit codes: 0 success, 1 a simulation process died (a bug), 2 bad input (malformed or inconsistent workload,\n"
      "layout or cluster, a GPU count the cluster cannot hold, an unwritable output): one line on stderr and\n"
      "nothing written. Details: docs/planner.md.",
      kTool};
  app.add_option("--workload", o.workload,
                 "preset (see --list-workloads: llama3.1-8b, deepseek-v3, ...) or workload JSON (mkernel.workload.v1)")
      ->capture_default_str();
  app.add_option("--hf-config", o.hfConfig,
                 "a Hugging Face config.json: its model replaces the workload's (docs/planner.md)");
  app.add_option("--megatron-args", o.megatronArgs,
                 "Megatron-LM / NeMo arguments, a file (one or more a line) or a string: model, training and layout");
  app.add_option("--recipe", o.recipe,
                 "a YAML recipe (Megatron-LM --yaml-cfg or NeMo 1.x megatron_gpt_config): model, training and layout");
  app.add_option("--layout", o.layoutFile, "layout JSON ({\"tp\": 8, \"pp\": 4, ...}) applied over the workload's");
  app.add_option("--tp", o.tp, "tensor parallelism");
  app.add_option("--pp", o.pp, "pipeline stages");
  app.add_option("--ep", o.ep, "expert parallelism (MoE)");
  app.add_option("--cp", o.cp, "context parallelism (layout.cpCommType in --layout; default p2p)");
  app.add_option("--zero", o.zero, "ZeRO stage 0..3");
  app.add_option("--sp", o.sp, "sequence parallelism: on or off");
  app.add_option("--pp-schedule", o.ppSchedule, "pipeline schedule: 1f1b, interleaved, gpipe");
  app.add_option("--virtual-stages", o.virtualStages, "model chunks per GPU (interleaved)");
  app.add_option("--micro-batch", o.microBatch, "sequences per micro-batch");
  app.add_option("--global-batch", o.globalBatch, "sequences per optimizer step");
  app.add_option("--seq", o.seq, "tokens per sequence");
  app.add_option("--recompute", o.recompute, "activation recomputation: none, full or selective");
  app.add_option("--recompute-modules", o.recomputeModules,
                 "selective recomputation's modules: core_attn,mlp,moe_act,norms (default core_attn)");
  app.add_option("--bucket", o.bucket, "gradient bucket size (25MiB, ...)");
  app.add_option("--cluster", o.cluster,
                 "preset node type (dgx-h100, dgx-h200, h200x2; nodes are added as the GPU count needs) or topology "
                 "JSON (a fixed cluster); " +
                     mk::cli::defaultClusterNote())
      ->capture_default_str();
  app.add_option("--gpus", o.gpus, "GPU counts: MIN:MAX[:FACTOR] (powers of FACTOR, default 2) or a list 64,256,1000")
      ->capture_default_str();
  app.add_option("--profile", o.profile,
                 "hardware profile (mkernel.profile.v1); default: the committed calibrated profile "
                 "(validation/data/profiles/h200x2-calibrated.json)");
  app.add_flag("--datasheet", o.datasheet, "price with the cluster's datasheet defaults instead of a profile");
  app.add_option("--what-if", o.whatIfs,
                 "a variant, key=value[,key=value]: nic-bw=2x|GBs, nics=N, oversub=X, nodes-per-leaf=N, "
                 "nvlink-domain=N, noise=SIGMA, stragglers=FRACTION:SLOWDOWN, seed=N (repeatable)");
  app.add_option("--token-budget", o.tokenBudget, "tokens to train, for GPU-hours (15T, 800B, 2e12)")
      ->capture_default_str();
  app.add_option("--gpu-memory", o.gpuMemoryGB, "GB per GPU for the memory check (default: the GPU's datasheet)");
  app.add_option("--measured", o.measured,
                 "measurement directory for the GEMM model and the validation errors (default: the committed "
                 "validation/data/measured; none: no measurements)");
  app.add_option("--fused-validation", o.fusedValidation,
                 "directory of manifests (mkernel.fused-validation.v1) of fused operators measured across nodes: "
                 "their SimGrid replay's error is the fused confidence class (default: the committed "
                 "validation/data/fused-validation unless --measured none; none: not validated)");
  app.add_option("--sim-budget", o.simBudget,
                 "schedules of more steps are priced by their closed form instead of simulated (0: no limit)")
      ->capture_default_str();
  app.add_option("-j,--jobs", o.jobs, "simulations at once (each in its own process)")->capture_default_str();
  mk::cli::addMaxMemoryOption(app, o.guard,
                              "memory the simulations at once may take: each of the --jobs gets an equal share, and a "
                              "collective whose simulation is estimated above it is priced by its closed form "
                              "(marked), as above --sim-budget");
  app.add_option("--cache", o.cache,
                 "keep the validation's predictions between runs of this executable in DIR (a hit is what a fresh "
                 "simulation gives; a rebuilt tool starts over); none: simulate them every run")
      ->capture_default_str();
  app.add_option(
      "--report", o.reportDir,
      "an HTML folder: write DIR/index.html, PNG plots, DIR/plan.json and DIR/run-stats.json (new, empty or a previous "
      "report; written in a temporary directory, then renamed)");
  app.add_option("--json", o.jsonOut, "write plan.json (mkernel.plan.v1) here too");
  app.add_option("--stats", o.statsOut, "write the run's statistics (wall times, simulations) here");
  app.add_option("--emit-kernels", o.kernelsOut,
                 "write the kernel census here (mkernel.kernel-census.v1): every kernel of every stage of the "
                 "baseline's feasible GPU counts, its shape, FLOPs, bytes and the price the planner gave it");
  app.add_option("--python", o.python, "python with matplotlib for --report")->capture_default_str();
  app.add_option("--report-script", o.script, "the report generator")->capture_default_str();
  app.add_flag("--list-workloads", o.listWorkloads, "print the built-in workloads and their sources");
  app.add_flag("--check-steps", o.checkSteps,
               "predict every measured training step (\"op\": \"step\") of the --measured directory on one GPU "
               "and print measured, predicted and the error (docs/planner.md, \"Checked against real steps\")");
  app.add_flag("--search", o.search,
               "search the layouts (tp, pp, vp, cp, ep, micro-batch, ZeRO, recompute, overlap flags) at each GPU "
               "count: rank them by closed forms, re-price the best with SimGrid, plan the best (docs/planner.md, "
               "\"Layout search\")");
  app.add_option("--search-top", o.searchTop, "--search: layouts per GPU count re-priced with SimGrid")
      ->capture_default_str();
  app.add_option("--search-csv", o.searchCsv, "--search: write the ranked layouts as CSV here");
  app.add_option("--search-space", o.searchSpace,
                 "--search: full (every dimension) or parallelism (tp, cp, pp, vp, ep, dp and the lightest "
                 "recomputation that fits; the workload's micro-batch, ZeRO stage and overlap flags)")
      ->check(CLI::IsMember({"full", "parallelism"}))
      ->capture_default_str();
  app.add_flag("-q,--quiet", o.quiet, "no table on stdout");
  app.add_flag("--brief", o.brief, "print the baseline's table only (and the what-ifs side by side)");
  app.add_option("--shard", o.shard,
                 "plan work items i, i+n, i+2n, ... of the (variant, GPU count) items only, for mk-plan merge: i/n, or "
                 "auto (the rank of mpirun or a Slurm job array; docs/planner.md, \"Sharding\")");
  // mk-plan merge FILE... [--json, --report, ... OPTIONS]: the plan options are the shards' own (their plan.json).
  std::vector<std::string> merged;
  std::vector<char*> mergedArgv;
  if (argc > 1 && std::string(argv[1]) == "merge") {
    if (int rc = mk::cli::run(kTool, [&] { return mergeCommandLine(argc, argv, o.mergeFiles, merged); }); rc != 0)
      return rc;
    for (std::string& a : merged) mergedArgv.push_back(a.data());
    argc = static_cast<int>(mergedArgv.size());
    argv = mergedArgv.data();
  }
  if (int rc = mk::cli::parse(app, argc, argv, kTool); rc != mk::cli::kContinue) return rc;
  if (int rc = mk::cli::requirePositive(app, kTool, {{"--jobs", o.jobs}, {"--search-top", o.searchTop}});
      rc != mk::cli::kContinue)
    return rc;
  if (!o.mergeFiles.empty() && !o.shard.empty()) {
    std::fprintf(stderr, "%s: error: --shard with merge: the merge plans every item; leave --shard out\n", kTool);
    return mk::cli::kExitBadInput;
  }
  o.planArgs = planOptions(app);
  const std::string command = mk::cli::commandLine(kTool, argc, argv);
  return mk::cli::run(kTool, [&] { return run(o, command); });
}

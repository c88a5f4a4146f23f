// mkernel — the layout search: enumerate, prune, price by closed forms, re-price the best with SimGrid (search.hpp).
#include "mk/plan/search.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "mk/error.hpp"
#include "mk/util/size.hpp"
#include "mk/workload/memory.hpp"

namespace mk::plan {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// The fused operators are not what ranks layouts: the closed-form pass prices the layered side only.
class NoFusedPricer : public FusedOpPricer {
 public:
  bool available() const override { return false; }
  std::string unavailableReason() const override { return "not priced in the layout search's closed-form pass"; }
  FusedOpPrice price(const FusedOpRequest&) override {
    throw Error(ErrorCode::Internal, "NoFusedPricer::price called");
  }
};

std::vector<uint32_t> powersOfTwoUpTo(uint64_t limit) {
  std::vector<uint32_t> out;
  for (uint64_t v = 1; v <= limit && v <= (1u << 24); v *= 2) out.push_back(static_cast<uint32_t>(v));
  return out;
}

/// The field a refusal names ("layout.tp 3 does not divide ..." -> "layout.tp"), else "layout".
std::string fieldOf(const std::string& message) {
  // The first "layout.", "training." or "model." followed by letters (no <regex>: GCC 12's inlines warn under -O2).
  std::size_t best = std::string::npos, len = 0;
  for (const char* prefix : {"layout.", "training.", "model."}) {
    const std::size_t at = message.find(prefix);
    if (at == std::string::npos || at >= best) continue;
    std::size_t end = at + std::char_traits<char>::length(prefix), start = end;
    while (end < message.size() && std::isalpha(static_cast<unsigned char>(message[end]))) ++end;
    if (end == start) continue;
    best = at;
    len = end - at;
  }
  return best == std::string::npos ? std::string("layout") : message.substr(best, len);
}

void refuse(SearchPruning* p, const std::string& dim, const std::string& why) {
  if (!p) return;
  ++p->count[dim];
  p->example.emplace(dim, why);
}

/// A layout identical in everything the step depends on (the items' de-duplication key).
std::string keyOf(const Workload& w) {
  const ParallelLayout& l = w.layout;
  const TrainingSpec& t = w.training;
  std::ostringstream k;
  k << l.tp << '/' << l.pp << '/' << l.virtualStages << '/' << static_cast<int>(l.schedule) << '/' << l.cp << '/'
    << l.ep << '/' << t.microBatch << '/' << l.zero << '/' << static_cast<int>(t.recompute) << '/'
    << t.recomputeModules.coreAttn << t.recomputeModules.mlp << t.recomputeModules.moeAct << t.recomputeModules.norms
    << '/' << l.tpCommOverlap << l.overlapParamGather << l.overlapMoeA2a << l.overlapPpComm << l.sp << '/'
    << l.bucketBytes << '/' << static_cast<int>(l.cpCommType) << '/' << l.cpA2aSize;
  return k.str();
}

/// What dominates a step.
std::string boundOf(const StepBreakdown& b) {
  const std::pair<const char*, double> parts[] = {
      {"compute", b.computeUs}, {"TP", b.tp.exposedUs}, {"EP", b.ep.exposedUs},   {"CP", b.cp.exposedUs},
      {"PP", b.pp.exposedUs},   {"DP", b.dp.exposedUs}, {"PP bubble", b.bubbleUs}};
  const auto* best = std::max_element(std::begin(parts), std::end(parts),
                                      [](const auto& a, const auto& c) { return a.second < c.second; });
  return best->first;
}

std::string seconds(double us) {
  return us >= 1e6 ? formatNumber(us * 1e-6, 3) + " s" : formatNumber(us * 1e-3, 3) + " ms";
}

}  // namespace

std::string describeLayout(const Workload& w, const ResolvedLayout& r) {
  const ParallelLayout& l = w.layout;
  std::string s = "tp " + std::to_string(r.tp) + ", pp " + std::to_string(r.pp);
  if (r.virtualStages > 1) s += " (vp " + std::to_string(r.virtualStages) + ")";
  s += ", cp " + std::to_string(r.cp) + ", ep " + std::to_string(r.ep) + ", dp " + std::to_string(r.dp) + ", mb " +
       std::to_string(w.training.microBatch) + ", zero " + std::to_string(l.zero) + ", recompute " +
       toString(w.training.recompute);
  if (l.tpCommOverlap) s += ", tp-overlap";
  if (l.overlapParamGather && (l.zero == 1 || l.zero == 2)) s += ", gather-overlap";
  if (l.overlapMoeA2a) s += ", a2a-overlap";
  return s;
}

std::vector<PlanItem> enumerateLayouts(const Workload& w, const std::vector<uint32_t>& gpus, uint32_t nvlinkDomain,
                                       std::map<uint32_t, SearchPruning>* pruned, SearchSpace space) {
  const bool full = space == SearchSpace::Full;
  const std::vector<uint32_t> mbs = full ? powersOfTwoUpTo(8) : std::vector<uint32_t>{w.training.microBatch};
  const std::vector<uint32_t> zeros = full ? std::vector<uint32_t>{0, 1, 2, 3} : std::vector<uint32_t>{w.layout.zero};
  const ModelShape& m = w.model;
  const uint32_t layers = m.layers;
  std::vector<PlanItem> out;
  for (uint32_t g : gpus) {
    SearchPruning* pr = pruned ? &(*pruned)[g] : nullptr;
    std::set<std::string> seen;
    auto consider = [&](Workload c) {
      try {
        validateWorkload(c);
        const ResolvedLayout r = resolveLayout(c, g);
        // 1F1B and interleaved fill the pipeline with at least pp micro-batches (Megatron-LM's schedules).
        if (r.pp > 1 && r.microBatches < r.pp) {
          refuse(pr, "layout.pp",
                 "fewer micro-batches per replica (" + std::to_string(r.microBatches) + ") than pipeline stages (" +
                     std::to_string(r.pp) + ")");
          return;
        }
      } catch (const Error& e) {
        if (e.code() != ErrorCode::InvalidArgument) throw;
        refuse(pr, fieldOf(e.message()), e.message());
        return;
      }
      if (seen.insert(keyOf(c)).second) out.push_back(PlanItem{g, std::move(c)});
    };
    consider(w);  // the workload's own layout first: the search always prices it
    for (uint32_t tp : powersOfTwoUpTo(nvlinkDomain)) {
      if (m.heads % tp != 0) {
        refuse(pr, "layout.tp", "layout.tp " + std::to_string(tp) + " does not divide model.heads");
        continue;
      }
      for (uint32_t cp : powersOfTwoUpTo(16)) {
        for (uint32_t pp : powersOfTwoUpTo(std::min<uint64_t>(layers, g))) {
          if (uint64_t{tp} * cp * pp > g || g % (tp * cp * pp) != 0) {
            refuse(pr, "gpus", "tp x cp x pp does not divide " + std::to_string(g) + " GPUs");
            continue;
          }
          std::vector<uint32_t> vps{1};
          // Megatron-LM's interleaved schedule: layers divisible by pp x vp.
          for (uint32_t vp = 2; pp > 1 && uint64_t{pp} * vp <= layers && vp <= 8; ++vp)
            if (layers % (pp * vp) == 0) vps.push_back(vp);
          std::vector<uint32_t> eps{1};
          if (m.moe) eps = powersOfTwoUpTo(m.moe->experts);
          for (uint32_t vp : vps)
            for (uint32_t ep : eps)
              for (uint32_t mb : mbs)
                for (uint32_t zero : zeros)
                  for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full})
                    for (int flags = 0; flags < 8; ++flags) {
                      bool tpOv = flags & 1, gatherOv = flags & 2, a2aOv = flags & 4;
                      if (!full) {  // the workload's own flags, once
                        if (flags != 0) continue;
                        tpOv = w.layout.tpCommOverlap && tp > 1;
                        gatherOv = w.layout.overlapParamGather && (zero == 1 || zero == 2);
                        a2aOv = w.layout.overlapMoeA2a && ep > 1;
                      }
                      // A flag that changes nothing is one layout, not two.
                      if (tpOv && tp == 1) continue;
                      if (gatherOv && zero != 1 && zero != 2) continue;
                      if (a2aOv && ep == 1) continue;
                      Workload c = w;
                      ParallelLayout& l = c.layout;
                      l.tp = tp;
                      l.cp = cp;
                      l.pp = pp;
                      l.dp.reset();
                      l.ep = ep;
                      l.etp = 1;
                      l.virtualStages = vp;
                      l.schedule = vp > 1 ? PipelineSchedule::Interleaved : PipelineSchedule::OneFOneB;
                      l.zero = zero;
                      l.sp = tp > 1 || m.moe ? true : l.sp;
                      l.tpCommOverlap = tpOv;
                      l.overlapParamGather = gatherOv;
                      l.overlapMoeA2a = a2aOv;
                      c.training.microBatch = mb;
                      c.training.recompute = rc;
                      c.training.recomputeModules = {};
                      c.training.recomputeModules.coreAttn = rc == Recompute::Selective;  // Megatron-LM's default
                      consider(std::move(c));
                    }
        }
      }
    }
  }
  return out;
}

PlanResult searchLayouts(const PlanInputs& in, FusedOpPricer& fused, const SearchSettings& settings,
                         const std::function<void(const std::string&)>& progress) {
  const auto t0 = Clock::now();
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  validateWorkload(in.workload);
  if (in.gpus.empty()) throw Error(ErrorCode::InvalidArgument, "no GPU count to search (--gpus)");
  if (settings.top == 0) throw Error(ErrorCode::InvalidArgument, "--search-top must be >= 1 (got 0)");
  auto result = std::make_shared<SearchResult>();
  SearchResult& s = *result;
  s.top = settings.top;
  const Topology cluster = loadTopology(in.cluster);
  s.memoryCapacity = in.gpuMemoryGB ? *in.gpuMemoryGB * 1e9 : gpuMemoryBytes(cluster.node.gpu);

  // ---- enumerate, then prune by memory before anything is priced ----
  std::vector<PlanItem> all = enumerateLayouts(in.workload, in.gpus, cluster.node.gpus, &s.pruned, settings.space);
  std::vector<PlanItem> fitting;
  std::map<uint32_t, double> smallestNeed;
  std::map<std::string, Recompute> lightestFitting;  // per layout without its recomputation
  const std::string own = keyOf(in.workload);
  for (PlanItem& it : all) {
    ++s.enumerated[it.gpus];
    const ResolvedLayout r = resolveLayout(it.workload, it.gpus);
    double need = 0;
    try {
      need = estimateMemory(it.workload, lowerStep(it.workload, r)).total();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::InvalidArgument && e.code() != ErrorCode::Unsupported) throw;
      refuse(&s.pruned[it.gpus], fieldOf(e.message()), e.message());
      continue;
    }
    double& smallest = smallestNeed[it.gpus];
    if (smallest == 0 || need < smallest) smallest = need;
    if (s.memoryCapacity > 0 && need > s.memoryCapacity) {
      refuse(&s.pruned[it.gpus], "memory", "needs " + formatBytes(need) + " per GPU");
      continue;
    }
    // Recomputation only adds compute: where a lighter one of the same layout fits, the heavier is never faster.
    Workload lighter = it.workload;
    lighter.training.recompute = Recompute::None;
    lighter.training.recomputeModules = {};
    const std::string base = std::to_string(it.gpus) + "|" + keyOf(lighter);
    const bool isOwn = keyOf(it.workload) == own;  // always priced, and no measure for the others
    const auto at = isOwn ? lightestFitting.end() : lightestFitting.emplace(base, it.workload.training.recompute).first;
    if (!isOwn && it.workload.training.recompute != at->second) {
      refuse(&s.pruned[it.gpus], "training.recompute",
             std::string("recompute \"") + toString(at->second) + "\" of the same layout fits and computes less");
      continue;
    }
    fitting.push_back(std::move(it));
  }
  s.items = fitting;
  for (uint32_t g : in.gpus) {
    if (std::any_of(fitting.begin(), fitting.end(), [&](const PlanItem& it) { return it.gpus == g; })) continue;
    std::string why;
    for (const auto& [dim, n] : s.pruned[g].count) {
      std::string ex = s.pruned[g].example.at(dim);
      if (dim == "memory")
        ex = "the smallest needs " + formatBytes(smallestNeed[g]) + " per GPU, above " + formatBytes(s.memoryCapacity) +
             " (--gpu-memory)";
      why += (why.empty() ? "" : "; ") + dim + " (" + std::to_string(n) + "): " + ex;
    }
    throw Error(ErrorCode::InvalidArgument,
                "--search: no feasible layout of " + in.workload.name + " on " + std::to_string(g) + " GPUs; " + why);
  }

  // ---- every fitting layout priced with closed forms ----
  say("search: " + std::to_string(all.size()) + " layouts enumerated, " + std::to_string(fitting.size()) +
      " fit; pricing them by closed forms");
  const auto tc = Clock::now();
  PlanInputs cin = in;
  cin.whatIfs.clear();
  cin.items = fitting;
  cin.pricer.budgetSteps = 1;  // every collective by its closed form: nothing generated, nothing simulated
  NoFusedPricer noFused;
  const PlanResult closed = runPlan(cin, noFused);
  s.closedFormS = since(tc);
#if defined(__GLIBC__)
  // The closed-form pass freed the lowerings of every layout, gigabytes at 16384 GPUs, which glibc keeps mapped;
  // the SimGrid pass forks a process per simulation and per validated record, and each fork copies the page
  // table of every mapped page (most of that pass's time before this).
  malloc_trim(0);
#endif
  const std::vector<ScaleResult>& cs = closed.variants.front().scales;
  std::map<uint32_t, std::vector<std::size_t>> byCount;  // feasible items, fastest first
  for (std::size_t i = 0; i < cs.size(); ++i)
    if (cs[i].feasible) byCount[cs[i].gpus].push_back(i);

  // ---- the best K of each GPU count, and the workload's own layout, with SimGrid ----
  std::vector<std::size_t> chosen;
  for (auto& [g, idx] : byCount) {
    std::stable_sort(idx.begin(), idx.end(),
                     [&](std::size_t a, std::size_t b) { return cs[a].layered.stepUs < cs[b].layered.stepUs; });
    for (std::size_t k = 0; k < idx.size() && k < settings.top; ++k) chosen.push_back(idx[k]);
    for (std::size_t i : idx)
      if (keyOf(fitting[i].workload) == own && std::find(chosen.begin(), chosen.end(), i) == chosen.end())
        chosen.push_back(i);
  }
  std::sort(chosen.begin(), chosen.end());
  say("search: pricing the best " + std::to_string(settings.top) + " of each GPU count with SimGrid (" +
      std::to_string(chosen.size()) + " layouts)");
  const auto tsim = Clock::now();
  PlanInputs sin = in;
  for (std::size_t i : chosen) sin.items.push_back(fitting[i]);
  PlanResult plan = runPlan(sin, fused, progress);
  s.simulatedS = since(tsim);

  // ---- the ranked rows ----
  std::map<std::size_t, const ScaleResult*> simulated;  // item -> its simulated baseline scale
  for (const ScaleResult& sr : plan.variants.front().scales)
    if (sr.feasible) simulated[chosen[sr.item]] = &sr;
  for (const auto& [g, idx] : byCount) {
    std::vector<SearchRow> rows;
    for (std::size_t i : idx) {
      const ScaleResult& c = cs[i];
      SearchRow row;
      row.item = i;
      row.gpus = g;
      row.layout = describeLayout(fitting[i].workload, c.layout);
      row.preset = keyOf(fitting[i].workload) == own;
      row.closedFormUs = c.layered.stepUs;
      const ScaleResult& use = simulated.count(i) ? *simulated.at(i) : c;
      row.simulatedUs = simulated.count(i) ? use.layered.stepUs : 0;
      row.memoryBytes = use.memory.total();
      row.tokensPerS = use.tokensPerS;
      row.mfu = use.mfu;
      row.bound = boundOf(use.layered);
      rows.push_back(std::move(row));
    }
    std::stable_sort(rows.begin(), rows.end(), [](const SearchRow& a, const SearchRow& b) {
      if ((a.simulatedUs > 0) != (b.simulatedUs > 0)) return a.simulatedUs > 0;
      return a.stepUs() < b.stepUs();
    });
    s.rows.insert(s.rows.end(), rows.begin(), rows.end());
  }
  // The Pareto front of step time against GPUs: no row as fast or faster on as few or fewer GPUs.
  double bestSoFar = 0;
  for (uint32_t g : in.gpus) {
    const auto first = std::find_if(s.rows.begin(), s.rows.end(), [&](const SearchRow& r) { return r.gpus == g; });
    if (first == s.rows.end()) continue;
    if (bestSoFar == 0 || first->stepUs() < bestSoFar) {
      first->pareto = true;
      bestSoFar = first->stepUs();
    }
  }

  // The plan shown: the recommended layout at each GPU count (every variant).
  std::set<std::size_t> best;
  for (const SearchRow& r : s.rows)
    if (std::none_of(best.begin(), best.end(), [&](std::size_t b) { return s.items[b].gpus == r.gpus; }))
      best.insert(r.item);
  for (VariantResult& v : plan.variants) {
    std::vector<ScaleResult> keep;
    for (ScaleResult& sr : v.scales)
      if (best.count(chosen[sr.item])) keep.push_back(std::move(sr));
    v.scales = std::move(keep);
  }
  s.wallS = since(t0);
  plan.search = result;
  return plan;
}

std::string formatSearchText(const SearchResult& s, std::size_t rowsPerCount) {
  std::ostringstream o;
  o << "== layout search: " << s.items.size() << " feasible layouts priced by closed forms in "
    << formatNumber(s.closedFormS, 3) << " s, the best " << s.top << " of each GPU count (and the workload's own) with "
    << "SimGrid in " << formatNumber(s.simulatedS, 3) << " s\n";
  for (const auto& [g, n] : s.enumerated) {
    std::size_t feasible = 0;
    for (const PlanItem& it : s.items) feasible += it.gpus == g;
    o << "\n" << g << " GPUs: " << n << " layouts enumerated, " << feasible << " fit";
    const auto pr = s.pruned.find(g);
    if (pr != s.pruned.end())
      for (const auto& [dim, c] : pr->second.count) o << "; " << c << " refused by " << dim;
    o << "\n  rank       step  priced by   memory   bound      tokens/s   MFU  layout\n";
    std::size_t rank = 0;
    for (const SearchRow& r : s.rows) {
      if (r.gpus != g) continue;
      if (++rank > rowsPerCount && !r.preset) continue;
      char line[512];
      std::snprintf(line, sizeof line, "  %4zu %10s  %-9s %8s   %-9s %10.0f %4.0f %%  %s%s\n", rank,
                    seconds(r.stepUs()).c_str(), r.simulatedUs > 0 ? "simgrid" : "closed",
                    formatBytes(r.memoryBytes).c_str(), r.bound.c_str(), r.tokensPerS, r.mfu * 100, r.layout.c_str(),
                    r.preset ? "  (the workload's own)" : "");
      o << line;
    }
  }
  o << "\nPareto front (step time against GPUs):";
  for (const SearchRow& r : s.rows)
    if (r.pareto) o << "  " << r.gpus << " GPUs " << seconds(r.stepUs());
  o << "\n";
  return o.str();
}

std::string searchToJson(const SearchResult& s) {
  nlohmann::ordered_json counts = nlohmann::ordered_json::object();
  for (const auto& [g, n] : s.enumerated) {
    std::size_t feasible = 0;
    for (const PlanItem& it : s.items) feasible += it.gpus == g;
    nlohmann::ordered_json refused = nlohmann::ordered_json::object();
    if (const auto pr = s.pruned.find(g); pr != s.pruned.end())
      for (const auto& [dim, c] : pr->second.count)
        refused[dim] = {{"count", c}, {"example", pr->second.example.at(dim)}};
    counts[std::to_string(g)] = {{"enumerated", n}, {"feasible", feasible}, {"refused", refused}};
  }
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const SearchRow& r : s.rows)
    rows.push_back({{"gpus", r.gpus},
                    {"layout", r.layout},
                    {"preset", r.preset},
                    {"step_us", r.stepUs()},
                    {"closed_form_us", r.closedFormUs},
                    {"simulated_us", r.simulatedUs > 0 ? nlohmann::ordered_json(r.simulatedUs) : nullptr},
                    {"memory_bytes", r.memoryBytes},
                    {"bound", r.bound},
                    {"tokens_per_s", r.tokensPerS},
                    {"mfu", r.mfu},
                    {"pareto", r.pareto}});
  nlohmann::ordered_json j = {
      {"top", s.top}, {"memory_capacity_bytes", s.memoryCapacity}, {"gpu_counts", counts}, {"ranked", rows}};
  return j.dump();
}

std::string searchToCsv(const SearchResult& s) {
  std::ostringstream o;
  o << "gpus,rank,layout,preset,step_us,closed_form_us,simulated_us,memory_bytes,bound,tokens_per_s,mfu,pareto\n";
  uint32_t g = 0;
  std::size_t rank = 0;
  for (const SearchRow& r : s.rows) {
    rank = r.gpus == g ? rank + 1 : 1;
    g = r.gpus;
    o << r.gpus << ',' << rank << ",\"" << r.layout << "\"," << (r.preset ? 1 : 0) << ',' << r.stepUs() << ','
      << r.closedFormUs << ',' << r.simulatedUs << ',' << r.memoryBytes << ',' << r.bound << ',' << r.tokensPerS << ','
      << r.mfu << ',' << (r.pareto ? 1 : 0) << '\n';
  }
  return o.str();
}

}  // namespace mk::plan

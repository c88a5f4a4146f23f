// mkernel — the layout search (mk-plan --search; docs/planner.md, "Layout search"): every layout of a workload that
// runs on each GPU count (TP, PP, virtual stages, CP, EP, DP, micro-batch, ZeRO stage, recomputation, overlap
// flags), pruned by the rules frameworks enforce and by memory, priced by the planner with every collective's
// closed form, and the best K of each GPU count (and the workload's own layout) priced again with SimGrid.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mk/plan/planner.hpp"

namespace mk::plan {

/// Which dimensions a search varies.
enum class SearchSpace : uint8_t {
  /// Every dimension: TP, CP, PP, virtual stages, EP, micro-batch, ZeRO stage, recomputation, overlap flags.
  Full,
  /// The parallel layout only (TP, CP, PP, virtual stages, EP, DP) and the lightest recomputation that fits; the
  /// micro-batch, ZeRO stage and overlap flags stay the workload's: a recipe's fixed choices, about 100 times fewer
  /// layouts than Full.
  Parallelism,
};

/// How far to search.
struct SearchSettings {
  std::size_t top = 5;  ///< layouts per GPU count priced again with SimGrid (plus the workload's own)
  SearchSpace space = SearchSpace::Full;
};

/// Why the layouts of one GPU count that were not priced were left out: dimension ("layout.tp", "memory", ...)
/// -> how many, and one example of the reason.
struct SearchPruning {
  std::map<std::string, std::size_t> count;
  std::map<std::string, std::string> example;
};

/// The enumerated space: every candidate (deterministic order: GPU count, then tp, cp, pp, virtual stages, ep,
/// micro-batch, ZeRO, recomputation, overlap flags; the workload's own layout first at each count), each an item a
/// shard can take on its own. `nvlinkDomain`: the largest TP. `pruned[gpus]` receives the candidates refused by a
/// framework rule (the memory check comes with pricing: searchLayouts).
/// SearchSpace::Parallelism keeps the workload's micro-batch, ZeRO stage and overlap flags.
std::vector<PlanItem> enumerateLayouts(const Workload& w, const std::vector<uint32_t>& gpus, uint32_t nvlinkDomain,
                                       std::map<uint32_t, SearchPruning>* pruned = nullptr,
                                       SearchSpace space = SearchSpace::Full);

/// "tp 8, pp 16 (vp 2), cp 1, ep 1, dp 128, mb 1, zero 1, recompute none, tp-overlap": one line for a layout.
std::string describeLayout(const Workload& w, const ResolvedLayout& r);

/// One priced layout.
struct SearchRow {
  std::size_t item = 0;  ///< into SearchResult::items
  uint32_t gpus = 0;
  std::string layout;       ///< describeLayout
  bool preset = false;      ///< the workload's own layout
  double closedFormUs = 0;  ///< step time with every collective's closed form
  double simulatedUs = 0;   ///< with SimGrid (0: not re-priced)
  double stepUs() const noexcept { return simulatedUs > 0 ? simulatedUs : closedFormUs; }
  double memoryBytes = 0;  ///< per GPU of the stage that needs the most
  double tokensPerS = 0, mfu = 0;
  std::string bound;    ///< the largest part of the step: "compute", "TP", "EP", "CP", "PP", "PP bubble", "DP"
  bool pareto = false;  ///< no other row runs as fast on as few GPUs
};

/// The search.
struct SearchResult {
  std::vector<PlanItem> items;                 ///< enumerateLayouts, every one
  std::map<uint32_t, SearchPruning> pruned;    ///< per GPU count
  std::map<uint32_t, std::size_t> enumerated;  ///< candidates per GPU count
  std::vector<SearchRow> rows;  ///< ranked per GPU count: re-priced first (by simulated time), then the rest
  double memoryCapacity = 0;    ///< bytes per GPU the memory check used
  std::size_t top = 0;
  double wallS = 0, closedFormS = 0, simulatedS = 0;
};

/// Search the layouts of `in.workload` on every count of `in.gpus`. The returned plan is the planner's own of the
/// best layout at each GPU count (its variants as in.whatIfs; plan.search holds the ranked list). Throws
/// Error(InvalidArgument) naming each dimension's reason when a GPU count has no feasible layout.
PlanResult searchLayouts(const PlanInputs& in, FusedOpPricer& fused, const SearchSettings& settings,
                         const std::function<void(const std::string&)>& progress = {});

/// The terminal text: per GPU count the ranked list (top rows), why the rest were pruned, the Pareto front.
std::string formatSearchText(const SearchResult& s, std::size_t rowsPerCount = 10);
/// plan.json's "search" block: the space per GPU count (enumerated, feasible, refused by dimension), the ranked
/// rows and the Pareto front; no wall times (the same inputs give the same text).
std::string searchToJson(const SearchResult& s);
/// One CSV line per ranked row (header first).
std::string searchToCsv(const SearchResult& s);

}  // namespace mk::plan

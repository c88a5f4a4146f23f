// Tests of the layout search (search.hpp): the enumerated space against a hand enumeration, the ranking against
// the planner's own price of each layout, the workload's own layout never beaten by a slower recommendation, and
// the refusal of a space with no feasible layout.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>

#include "mk/error.hpp"
#include "mk/plan/search.hpp"

namespace {

using namespace mk;
using namespace mk::plan;

/// Two layers, 8 heads, 4 sequences a step: a space small enough to enumerate by hand.
Workload tinyWorkload() {
  Workload w;
  w.name = "tiny";
  w.model.layers = 2;
  w.model.hidden = 512;
  w.model.ffn = 1024;
  w.model.heads = 8;
  w.model.kvHeads = 8;
  w.model.vocab = 1024;
  w.training.seq = 1024;
  w.training.microBatch = 1;
  w.training.globalBatch = 4;
  w.layout.tp = 2;
  w.layout.pp = 1;
  validateWorkload(w);
  return w;
}

PlanInputs tinyInputs() {
  PlanInputs in;
  in.workload = tinyWorkload();
  in.cluster = "dgx-h100";
  in.gpus = {8};
  in.datasheet = true;
  in.pricer.jobs = 1;
  return in;
}

class NoFused : public FusedOpPricer {
 public:
  bool available() const override { return false; }
  std::string unavailableReason() const override { return "test"; }
  FusedOpPrice price(const FusedOpRequest&) override { throw Error(ErrorCode::Internal, "unused"); }
};

}  // namespace

TEST_CASE("search: the enumerated layouts of a 2-layer model on 8 GPUs are the hand-enumerated ones") {
  const Workload w = tinyWorkload();
  std::set<std::string> got;
  for (const PlanItem& it : enumerateLayouts(w, {8}, 8)) {
    CHECK(it.gpus == 8);
    const ResolvedLayout r = resolveLayout(it.workload, 8);
    CHECK(got.insert(describeLayout(it.workload, r)).second);  // no layout twice
  }
  // By hand: tp x cp x pp x dp = 8 with tp, cp powers of two (8 heads, seq 1024), pp 1 or 2 (2 layers, no room
  // for virtual stages), dp x mb dividing the 4 sequences with at least pp micro-batches; ZeRO 0..3 (the gather
  // overlap on or off under ZeRO 1 and 2), three recomputations, the TP overlap on or off where tp > 1.
  std::set<std::string> want;
  for (uint32_t tp = 1; tp <= 8; tp *= 2)
    for (uint32_t cp = 1; tp * cp <= 8; cp *= 2)
      for (uint32_t pp = 1; pp <= 2 && tp * cp * pp <= 8; ++pp) {
        const uint32_t dp = 8 / (tp * cp * pp);
        for (uint32_t mb = 1; mb <= 8; mb *= 2) {
          if (4 % (dp * mb) != 0 || 4 / (dp * mb) < pp) continue;
          for (uint32_t zero = 0; zero <= 3; ++zero)
            for (const char* rc : {"none", "selective", "full"})
              for (int tpOv = 0; tpOv <= (tp > 1 ? 1 : 0); ++tpOv)
                for (int gOv = 0; gOv <= (zero == 1 || zero == 2 ? 1 : 0); ++gOv)
                  want.insert("tp " + std::to_string(tp) + ", pp " + std::to_string(pp) + ", cp " + std::to_string(cp) +
                              ", ep 1, dp " + std::to_string(dp) + ", mb " + std::to_string(mb) + ", zero " +
                              std::to_string(zero) + ", recompute " + rc + (tpOv ? ", tp-overlap" : "") +
                              (gOv ? ", gather-overlap" : ""));
        }
      }
  CHECK(got == want);
}

TEST_CASE("search: the ranked list is priced as the planner prices each layout, and beats the workload's own") {
  PlanInputs in = tinyInputs();
  NoFused fused;
  const PlanResult plan = searchLayouts(in, fused, SearchSettings{2});
  REQUIRE(plan.search.get() != nullptr);
  const SearchResult& s = *plan.search;
  REQUIRE(s.rows.size() >= 3);
  // Re-priced rows first, each ranked no slower than the next.
  bool ownSeen = false;
  for (std::size_t i = 0; i < s.rows.size(); ++i) {
    const SearchRow& r = s.rows[i];
    if (i + 1 < s.rows.size() && (r.simulatedUs > 0) == (s.rows[i + 1].simulatedUs > 0))
      CHECK(r.stepUs() <= s.rows[i + 1].stepUs());
    if (i + 1 < s.rows.size() && r.simulatedUs == 0) CHECK(s.rows[i + 1].simulatedUs == 0);
    if (r.preset) {
      ownSeen = true;
      CHECK(r.simulatedUs > 0);  // the workload's own layout is always re-priced
      CHECK(s.rows.front().stepUs() <= r.stepUs());
    }
  }
  CHECK(ownSeen);
  // The best row's price is the planner's own price of that layout alone.
  PlanInputs alone = in;
  alone.workload = s.items[s.rows.front().item].workload;
  const PlanResult one = runPlan(alone, fused);
  REQUIRE(one.variants.front().scales.front().feasible);
  CHECK(one.variants.front().scales.front().layered.stepUs == doctest::Approx(s.rows.front().simulatedUs));
  // The plan shown is the recommended layout's.
  REQUIRE(plan.variants.front().scales.size() == 1);
  CHECK(plan.variants.front().scales.front().layered.stepUs == doctest::Approx(s.rows.front().stepUs()));
  CHECK(s.rows.front().pareto);
  CHECK(searchToCsv(s).find(s.rows.front().layout) != std::string::npos);
}

TEST_CASE("search: a space with no feasible layout is refused naming the dimension") {
  PlanInputs in = tinyInputs();
  NoFused fused;
  in.gpuMemoryGB = 1e-6;
  try {
    searchLayouts(in, fused, SearchSettings{});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK(std::string(e.what()).find("memory") != std::string::npos);
  }
  in.gpuMemoryGB.reset();
  in.gpus = {3};  // no power of two but 1 divides 3, and 3 replicas cannot share 4 sequences
  try {
    searchLayouts(in, fused, SearchSettings{});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK(std::string(e.what()).find("training.globalBatch") != std::string::npos);
  }
}

TEST_CASE("search: over every preset, the recommended layout is never slower than the preset's own") {
  NoFused fused;
  for (const std::string& name : workloadPresets()) {
    CAPTURE(name);
    PlanInputs in;
    in.workload = workloadPreset(name);
    in.cluster = "dgx-h100";
    in.datasheet = true;
    in.gpuMemoryGB = 1e6;  // every layout fits: the preset's own is always priced
    in.pricer.jobs = 1;
    in.pricer.budgetSteps = 1;  // every collective by its closed form, in both passes: the ranking is what is tested
    // The smallest GPU count the preset's own layout runs on (a power of two times tp x cp x pp): the fewest
    // layouts to price.
    const ParallelLayout& l = in.workload.layout;
    for (uint32_t g = l.tp * l.cp * l.pp; g <= 8192 && in.gpus.empty(); g *= 2) {
      try {
        const ResolvedLayout r = resolveLayout(in.workload, g);
        if (r.pp == 1 || r.microBatches >= r.pp) in.gpus = {g};
      } catch (const Error&) {
      }
    }
    REQUIRE(!in.gpus.empty());
    const PlanResult plan = searchLayouts(in, fused, SearchSettings{1, SearchSpace::Parallelism});
    const SearchResult& s = *plan.search;
    const auto own = std::find_if(s.rows.begin(), s.rows.end(), [](const SearchRow& r) { return r.preset; });
    REQUIRE(own != s.rows.end());
    CHECK(s.rows.size() > 1);
    CHECK(s.rows.front().stepUs() <= own->stepUs());
  }
}

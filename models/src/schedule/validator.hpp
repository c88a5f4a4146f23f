// mkernel — internal: the schedule validator's class and the records it keeps (validate.cpp has the rules and the
// entry points; the phases live in validate_steps.cpp (A structure, B per-step rules), validate_flow.cpp (C flag
// and barrier accounting, D symbolic execution) and validate_races.cpp (E happens-before and races)).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mk/schedule/validate.hpp"

namespace mk::validation {

constexpr std::size_t kMaxIssues = 1000;        // beyond this, problems are counted, not listed
constexpr uint64_t kDenseFlagLimit = 1u << 22;  // nRanks*nFlags up to this: direct table, else hash map
// Race-check budgets (vector-clock entries kept, entry joins performed, access intervals sorted). Above
// any of them the race check is skipped like it is above ValidateOptions::raceCheckMaxSteps.
constexpr uint64_t kClockEntryBudget = 1u << 24;
constexpr uint64_t kClockJoinBudget = 1u << 27;
constexpr uint64_t kAccessBudget = 1u << 22;
constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kNoSnap = std::numeric_limits<uint64_t>::max();

inline uint64_t addSat(uint64_t a, uint64_t b) noexcept {
  return b > std::numeric_limits<uint64_t>::max() - a ? std::numeric_limits<uint64_t>::max() : a + b;
}

inline std::string str(uint64_t v) { return std::to_string(v); }

/// Dense numbering of the (rank, id) flags a schedule actually uses.
class FlagIds {
 public:
  FlagIds(uint32_t nRanks, uint32_t nFlags) : nFlags_(nFlags) {
    const uint64_t n = uint64_t{nRanks} * nFlags;
    direct_ = n <= kDenseFlagLimit;
    if (direct_) table_.assign(n, kNone);
  }
  uint32_t get(FlagRef f) {
    const uint64_t key = uint64_t{f.rank} * nFlags_ + f.id;
    uint32_t* slot = nullptr;
    if (direct_) {
      slot = &table_[key];
    } else {
      slot = &map_.try_emplace(key, kNone).first->second;
    }
    if (*slot == kNone) {
      *slot = static_cast<uint32_t>(refs_.size());
      refs_.push_back(f);
    }
    return *slot;
  }
  FlagRef ref(uint32_t dense) const { return refs_[dense]; }
  std::size_t size() const noexcept { return refs_.size(); }

 private:
  uint64_t nFlags_;
  bool direct_;
  std::vector<uint32_t> table_;
  std::unordered_map<uint64_t, uint32_t> map_;
  std::vector<FlagRef> refs_;
};

/// One increment of a flag (a Signal, or a Put/ProxyPut with kStepSignal).
struct Increment {
  uint32_t flag;  ///< dense flag id
  uint32_t lane;  ///< global lane id
  uint32_t step;
  uint64_t value;
  uint64_t suffix;  ///< value + values of the same lane's later increments to the same flag
};

struct WaitRec {
  uint32_t lane, step, flag;
  uint64_t value;
};

struct BarrierRec {
  uint32_t id, rank, lane, step;
};

/// One element interval one step touches, for the race check.
struct Access {
  uint64_t key;  ///< rank * nBuffers + buffer
  uint64_t lo, hi;
  uint32_t lane, step;
  uint64_t snap;  ///< offset of the lane's clock snapshot in effect at this step, or kNoSnap
  bool write;
};

class Validator {
 public:
  Validator(const Schedule& s, const ValidateOptions& opt) : s_(s), opt_(opt) {}

  std::vector<ValidationIssue> run(uint64_t& suppressed);

  /// Why the race check did not run ("" when it ran, or when other problems made it moot).
  const std::string& raceSkipped() const { return raceSkipped_; }

 private:
  // ---- reporting ---------------------------------------------------------------------------------------
  void add(int64_t rank, int64_t lane, int64_t step, std::string msg);
  std::string where(uint32_t g, uint32_t i) const { return describeStep(s_, laneRank_[g], laneLocal_[g], i); }
  void addStep(uint32_t g, uint32_t i, const std::string& msg);
  std::string bufName(uint16_t b) const { return "'" + s_.buffers[b].name + "'"; }

  // ---- phase A: structure ------------------------------------------------------------------------------
  /// Returns false when sizes are so wrong that indexing by rank would be unsafe.
  bool checkStructure();

  void indexLanes();

  // ---- phase B: per-step rules -------------------------------------------------------------------------
  /// Index checks of one operand; false (and an index error) when it cannot be dereferenced.
  bool refOk(uint32_t g, uint32_t i, const BufRef& ref, const char* name);

  /// offset + extent <= count on that rank, written so that it cannot overflow.
  void rangeOk(uint32_t g, uint32_t i, const BufRef& ref, const char* name, uint64_t extent);

  void sameNodeOk(uint32_t g, uint32_t i, const BufRef& ref, const char* name, const char* kind);

  /// refOk on dst, a and b (called `names`), then sameNodeOk on each; false when one cannot be dereferenced.
  bool operandsOnNode(uint32_t g, uint32_t i, const Step& st, const std::array<const char*, 3>& names,
                      const char* kind);

  void dtypesAgree(uint32_t g, uint32_t i, std::initializer_list<std::pair<const char*, const BufRef*>> ops);

  /// dst must either coincide with a source or stay clear of it: engines split a step over many
  /// threads, so a partial overlap would read elements another thread already overwrote.
  void overlapOk(uint32_t g, uint32_t i, const BufRef& dst, const BufRef& src, const char* srcName, uint64_t n);

  bool flagOk(uint32_t g, uint32_t i, const FlagRef& f, const char* what);

  void recordIncrement(uint32_t g, uint32_t i, const Step& st);

  void checkSteps();

  void checkStep(uint32_t g, uint32_t i, uint32_t r, const Step& st);

  /// Why `extent` cannot size `full` (what: "count", "m"): an index out of range or a `full` that is not a multiple
  /// of its bound; empty when it can (or is kNoExtent).
  std::string extentProblem(uint32_t extent, uint64_t full, const char* what) const;

  void checkGemm(uint32_t g, uint32_t i, const Step& st);

  // ---- phase B for routing as data (validate_route.cpp) --------------------------------------------------
  /// Extent sources (extent.hpp): the buffer is declared and int32. Part of phase A.
  void checkExtentSources();
  /// A step of rank `rank` reads `extent`: with a source, its element must lie inside the source buffer there.
  void extentSourceOk(uint32_t g, uint32_t i, uint32_t rank, uint32_t extent);
  /// Route: sizes (topk within experts, count tokens x topk), int32 operands on the executing rank, the layout
  /// clear of the ids.
  void checkRoute(uint32_t g, uint32_t i, uint32_t r, const Step& st);
  /// Gather: whole rows, int32 indices, operands on the executing rank's node, dst clear of its sources.
  void checkGather(uint32_t g, uint32_t i, const Step& st);
  void checkCombine(uint32_t g, uint32_t i, const Step& st);
  /// The operand `ref` (of `name`) lies in an int32 buffer.
  void int32Ok(uint32_t g, uint32_t i, const BufRef& ref, const char* name, const char* kind);
  /// [x, x + xn) and [y, y + yn) share no element (steps that read through indices cannot run in place).
  void disjointOk(uint32_t g, uint32_t i, const BufRef& x, uint64_t xn, const char* xName, const BufRef& y, uint64_t yn,
                  const char* yName);

  // ---- attention (validate_attention.cpp) -----------------------------------------------------------------
  /// Every attention shape is valid (attentionShapeProblem). Part of phase A.
  void checkAttentionShapes();
  /// Attention: the shape index, Q and K/V of one float dtype, a float32 out, ranges, out clear of its inputs.
  void checkAttention(uint32_t g, uint32_t i, const Step& st);
  void checkAttentionGrad(uint32_t g, uint32_t i, const Step& st);

  static uint64_t extentB(const GemmShape& gs, bool colB);

  // ---- phase C: flag and barrier accounting ------------------------------------------------------------
  void checkFlagAccounting();

  void checkBarriers();

  static void noteMissing(std::string& list, uint32_t& n, uint32_t rank);

  uint64_t stepKey(uint32_t g, uint32_t i) const { return stepBase_[g] + i; }

  // ---- phase D: symbolic execution ---------------------------------------------------------------------
  using Waiter = std::pair<uint64_t, uint32_t>;  // (threshold, lane), min-heap by threshold

  void simulate();

  void advance(uint32_t g);

  void reportBlocked();

  /// " (blocked senders: ...)" naming up to three increments that never ran: the other end of a cycle.
  std::string pendingSignallers(uint32_t f);

  /// Counting sort of increments by flag (stable: keeps lane-major, program order within a flag) and the
  /// per-lane suffix sums the wait rule needs.
  void groupIncrements();

  // ---- phase E: happens-before and races ---------------------------------------------------------------
  bool raceBudgetOk();

  void prepareClocks();

  /// Offset of lane g's clock snapshot in effect at step i (the last one taken at a step < i).
  uint64_t snapAt(uint32_t g, uint32_t i) const;

  /// scratch_ := lane g's clock in effect right after its step i.
  void loadClock(uint32_t g, uint32_t i);

  /// scratch_ := max(scratch_, clock of lane g right after its step i).
  void joinClock(uint32_t g, uint32_t i);

  uint64_t storeScratch();

  void joinWait(uint32_t g, uint32_t i, uint32_t f, uint64_t threshold);

  void joinBarrier(const std::vector<uint32_t>& lanes);

  /// Did access x (lane, step) complete before access y started?
  bool before(const Access& x, const Access& y) const;

  void checkRaces();

  const Schedule& s_;
  const ValidateOptions& opt_;
  std::vector<ValidationIssue> issues_;
  uint64_t suppressed_ = 0;
  std::string raceSkipped_;
  bool indexError_ = false;
  bool trackClocks_ = false;

  uint32_t nLanes_ = 0;
  uint64_t totalSteps_ = 0;
  std::vector<uint32_t> laneRank_, laneLocal_;
  std::vector<const Lane*> lanePtr_;
  std::vector<uint64_t> stepBase_;

  FlagIds flagIds_{s_.nRanks, s_.nFlags};
  std::vector<uint32_t> flagOf_;  ///< per global step: dense flag of a Wait / signalling step, else kNone
  std::vector<Increment> incs_;
  std::vector<WaitRec> waits_;
  std::vector<BarrierRec> barriers_;
  std::vector<uint64_t> total_, maxWait_;
  std::vector<uint8_t> hasWait_, flagBroken_;

  std::vector<uint32_t> barrierIds_;  ///< dense barrier -> id
  std::vector<uint8_t> barrierBroken_;
  std::unordered_map<uint64_t, uint32_t> barrierDense_;  ///< global step -> dense barrier

  std::vector<uint32_t> incFlagBegin_, groupBegin_;
  std::vector<std::pair<uint32_t, uint32_t>> groups_;
  bool grouped_ = false;

  std::vector<uint64_t> counter_;
  std::vector<std::vector<Waiter>> waiters_;
  std::vector<uint32_t> pc_, work_;
  std::vector<std::vector<uint32_t>> arrived_;

  std::vector<uint32_t> pool_, scratch_;
  std::vector<std::vector<std::pair<uint32_t, uint64_t>>> snaps_;  ///< per lane: (step, pool offset)
};

}  // namespace mk::validation

// mkernel — the schedule validator (rules in validate.hpp and docs/schedule-format.md).
//
// Phases: structure -> per-step rules -> flag and barrier accounting -> symbolic execution -> races.
// Everything is near-linear in the number of steps: flags are renumbered densely once, blocked waiters
// sit in per-flag min-heaps keyed by threshold, so an increment wakes exactly the waits it satisfies and
// nothing ever rescans all lanes.
//
// Race check (happens-before). Each lane keeps a vector clock with one entry per lane; entry l = number
// of lane l's steps known to have completed. Clocks change only at Wait and Barrier steps, so a lane
// stores one snapshot per such step and every other step reads the latest snapshot before it.
// The wait rule, chosen to be SOUND (it never claims an ordering that some execution can violate):
// a Wait for flag >= T, where the flag receives S in total, is ordered after increment x of lane l iff
// every execution needs x to reach T. Increments of one lane to one flag land in program order (the
// same lane's release operations on one location), so "x has not happened" leaves at most
// S - (x's value + the values of lane l's later increments to that flag). If that is < T, x is
// needed, and the wait joins x's clock (the signaller's clock at x, with x itself included). Orderings
// between increments of different lanes are deliberately ignored: that can only make the check report a
// race that cannot happen, never miss one. For the common full-consumption wait (T = S) the rule joins
// every increment. A barrier joins the clocks of all participants.
#include "mk/schedule/validate.hpp"

#include <algorithm>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "mk/error.hpp"
#include "mk/schedule/check.hpp"

namespace mk {
namespace {

constexpr std::size_t kMaxIssues = 1000;        // beyond this, problems are counted, not listed
constexpr uint64_t kDenseFlagLimit = 1u << 22;  // nRanks*nFlags up to this: direct table, else hash map
// Race-check budgets (vector-clock entries kept, entry joins performed, access intervals sorted). Above
// any of them the race check is skipped like it is above ValidateOptions::raceCheckMaxSteps.
constexpr uint64_t kClockEntryBudget = 1u << 24;
constexpr uint64_t kClockJoinBudget = 1u << 27;
constexpr uint64_t kAccessBudget = 1u << 22;
constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kNoSnap = std::numeric_limits<uint64_t>::max();

uint64_t addSat(uint64_t a, uint64_t b) noexcept {
  return b > std::numeric_limits<uint64_t>::max() - a ? std::numeric_limits<uint64_t>::max() : a + b;
}

std::string str(uint64_t v) { return std::to_string(v); }

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

  std::vector<ValidationIssue> run(uint64_t& suppressed) {
    if (checkStructure()) {
      indexLanes();
      checkSteps();
      checkFlagAccounting();
      checkBarriers();
      if (!indexError_) {
        const bool overSteps = s_.stepCount() > opt_.raceCheckMaxSteps;
        const bool raceWanted = opt_.checkRaces && !overSteps && issues_.empty();
        trackClocks_ = raceWanted && raceBudgetOk();
        if (!opt_.checkRaces)
          raceSkipped_ = "turned off";
        else if (overSteps)
          raceSkipped_ = str(s_.stepCount()) + " steps > " + str(opt_.raceCheckMaxSteps);
        else if (raceWanted && !trackClocks_)
          raceSkipped_ = "its vector clocks would exceed " + str(kClockEntryBudget) + " entries or " +
                         str(kClockJoinBudget) + " joins";
        simulate();
        if (trackClocks_ && issues_.empty()) checkRaces();
      }
    }
    suppressed = suppressed_;
    return std::move(issues_);
  }

  /// Why the race check did not run ("" when it ran, or when other problems made it moot).
  const std::string& raceSkipped() const { return raceSkipped_; }

 private:
  // ---- reporting ---------------------------------------------------------------------------------------
  void add(int64_t rank, int64_t lane, int64_t step, std::string msg) {
    if (issues_.size() >= kMaxIssues) {
      ++suppressed_;
      return;
    }
    ValidationIssue is;
    is.rank = rank;
    is.lane = lane;
    is.step = step;
    is.message = std::move(msg);
    issues_.push_back(std::move(is));
  }
  std::string where(uint32_t g, uint32_t i) const { return describeStep(s_, laneRank_[g], laneLocal_[g], i); }
  void addStep(uint32_t g, uint32_t i, const std::string& msg) {
    if (issues_.size() >= kMaxIssues) {
      ++suppressed_;
      return;
    }
    add(laneRank_[g], laneLocal_[g], i, where(g, i) + ": " + msg);
  }
  std::string bufName(uint16_t b) const { return "'" + s_.buffers[b].name + "'"; }

  // ---- phase A: structure ------------------------------------------------------------------------------
  /// Returns false when sizes are so wrong that indexing by rank would be unsafe.
  bool checkStructure() {
    bool ok = true;
    if (s_.nRanks == 0) {
      add(-1, -1, -1, "nRanks must be > 0 (got 0)");
      ok = false;
    }
    for (std::string problem : {nodeOfProblem(s_), laneListProblem(s_)})
      if (!problem.empty()) {
        add(-1, -1, -1, std::move(problem));
        ok = false;
      }
    if (s_.buffers.size() > 0xFFFF) {
      add(-1, -1, -1, str(s_.buffers.size()) + " buffers declared (at most 65535)");
      ok = false;
    }
    std::unordered_set<std::string> names;
    for (std::size_t b = 0; b < s_.buffers.size(); ++b) {
      const BufferDecl& d = s_.buffers[b];
      const std::string id = "buffers[" + str(b) + "] '" + d.name + "'";
      if (std::string problem = bufferCountProblem(s_, b); !problem.empty()) {
        add(-1, -1, -1, std::move(problem));
        ok = false;
      }
      if (static_cast<uint8_t>(d.dtype) > static_cast<uint8_t>(DType::Float16))
        add(-1, -1, -1, id + ": unknown dtype " + str(static_cast<uint8_t>(d.dtype)));
      if (static_cast<uint8_t>(d.kind) > static_cast<uint8_t>(BufferKind::InOut))
        add(-1, -1, -1, id + ": unknown buffer kind " + str(static_cast<uint8_t>(d.kind)));
      if (d.name.empty()) add(-1, -1, -1, id + ": a buffer name must not be empty (operands refer to it in JSON)");
      if (!names.insert(d.name).second) add(-1, -1, -1, id + ": duplicate buffer name");
    }
    for (std::size_t gi = 0; gi < s_.gemms.size(); ++gi) {
      const GemmShape& g = s_.gemms[gi];
      const std::string id = "gemms[" + str(gi) + "]";
      if (g.m == 0 || g.n == 0 || g.k == 0)
        add(-1, -1, -1, id + ": m, n, k must all be > 0 (got " + str(g.m) + ", " + str(g.n) + ", " + str(g.k) + ")");
      if (g.lda < g.k) add(-1, -1, -1, id + ": lda " + str(g.lda) + " < k " + str(g.k) + " (A is row-major m x k)");
      if (g.ldc < g.n) add(-1, -1, -1, id + ": ldc " + str(g.ldc) + " < n " + str(g.n) + " (C is row-major m x n)");
    }
    if (!ok) return false;
    for (uint32_t r = 0; r < s_.nRanks; ++r) {
      for (std::size_t l = 0; l < s_.lanes[r].size(); ++l) {
        const Lane& lane = s_.lanes[r][l];
        const std::string id = "rank " + str(r) + " lane " + str(l);
        if (static_cast<uint8_t>(lane.role) > static_cast<uint8_t>(LaneRole::InterRecv))
          add(r, static_cast<int64_t>(l), -1, id + ": unknown lane role " + str(static_cast<uint8_t>(lane.role)));
        if (lane.ctas == 0) add(r, static_cast<int64_t>(l), -1, id + ": ctas must be >= 1 (got 0)");
        if (lane.steps.size() >= kNone) {
          add(r, static_cast<int64_t>(l), -1, id + ": more than 2^32-2 steps");
          return false;
        }
      }
    }
    return true;
  }

  void indexLanes() {
    for (uint32_t r = 0; r < s_.nRanks; ++r) {
      for (std::size_t l = 0; l < s_.lanes[r].size(); ++l) {
        laneRank_.push_back(r);
        laneLocal_.push_back(static_cast<uint32_t>(l));
        lanePtr_.push_back(&s_.lanes[r][l]);
        stepBase_.push_back(totalSteps_);
        totalSteps_ += s_.lanes[r][l].steps.size();
      }
    }
    nLanes_ = static_cast<uint32_t>(lanePtr_.size());
    flagOf_.assign(totalSteps_, kNone);
  }

  // ---- phase B: per-step rules -------------------------------------------------------------------------
  /// Index checks of one operand; false (and an index error) when it cannot be dereferenced.
  bool refOk(uint32_t g, uint32_t i, const BufRef& ref, const char* name) {
    bool ok = true;
    if (ref.rank >= s_.nRanks) {
      addStep(g, i, std::string(name) + " rank " + str(ref.rank) + " out of range (nRanks " + str(s_.nRanks) + ")");
      ok = false;
    }
    if (ref.buffer >= s_.buffers.size()) {
      addStep(g, i,
              std::string(name) + " buffer id " + str(ref.buffer) + " out of range (" + str(s_.buffers.size()) +
                  " buffers)");
      ok = false;
    }
    if (!ok) indexError_ = true;
    return ok;
  }

  /// offset + extent <= count on that rank, written so that it cannot overflow.
  void rangeOk(uint32_t g, uint32_t i, const BufRef& ref, const char* name, uint64_t extent) {
    const uint64_t have = s_.buffers[ref.buffer].count[ref.rank];
    if (ref.offset > have || extent > have - ref.offset) {
      const std::string end = ref.offset > std::numeric_limits<uint64_t>::max() - extent ? std::string("overflow")
                                                                                         : str(ref.offset + extent);
      addStep(g, i,
              std::string(name) + " elements [" + str(ref.offset) + ", " + end + ") exceed buffer " +
                  bufName(ref.buffer) + " on rank " + str(ref.rank) + " (" + str(have) + " elements)");
    }
  }

  void sameNodeOk(uint32_t g, uint32_t i, const BufRef& ref, const char* name, const char* kind) {
    const uint32_t r = laneRank_[g];
    if (s_.nodeOf[ref.rank] != s_.nodeOf[r])
      addStep(g, i,
              std::string(name) + " is on rank " + str(ref.rank) + " (node " + str(s_.nodeOf[ref.rank]) +
                  "), not on this rank's node " + str(s_.nodeOf[r]) + ": " + kind +
                  " operands must be on the executing rank's node");
  }

  void dtypesAgree(uint32_t g, uint32_t i, std::initializer_list<std::pair<const char*, const BufRef*>> ops) {
    const auto& first = *ops.begin();
    const DType want = s_.buffers[first.second->buffer].dtype;
    for (const auto& [name, ref] : ops) {
      const DType have = s_.buffers[ref->buffer].dtype;
      if (have != want) {
        addStep(g, i,
                std::string("operand dtypes differ: ") + first.first + " " + bufName(first.second->buffer) + " is " +
                    toString(want) + ", " + name + " " + bufName(ref->buffer) + " is " + toString(have));
        return;
      }
    }
  }

  /// dst must either coincide with a source or stay clear of it: engines split a step over many
  /// threads, so a partial overlap would read elements another thread already overwrote.
  void overlapOk(uint32_t g, uint32_t i, const BufRef& dst, const BufRef& src, const char* srcName, uint64_t n) {
    if (dst.rank != src.rank || dst.buffer != src.buffer || dst.offset == src.offset || n == 0) return;
    const uint64_t lo = std::max(dst.offset, src.offset);
    const uint64_t hi = std::min(addSat(dst.offset, n), addSat(src.offset, n));
    if (lo < hi)
      addStep(g, i,
              std::string("dst [") + str(dst.offset) + ", " + str(addSat(dst.offset, n)) + ") partially overlaps " +
                  srcName + " [" + str(src.offset) + ", " + str(addSat(src.offset, n)) + ") in buffer " +
                  bufName(dst.buffer) + ": in-place operands must coincide exactly");
  }

  bool flagOk(uint32_t g, uint32_t i, const FlagRef& f, const char* what) {
    const std::vector<std::string> problems = flagProblems(s_, f, what);
    for (const std::string& problem : problems) addStep(g, i, problem);
    if (!problems.empty()) indexError_ = true;
    return problems.empty();
  }

  void recordIncrement(uint32_t g, uint32_t i, const Step& st) {
    if (st.value == 0) addStep(g, i, "signal increment must be >= 1 (got 0)");
    const uint32_t f = flagIds_.get(st.flag);
    flagOf_[stepBase_[g] + i] = f;
    incs_.push_back(Increment{f, g, i, st.value, 0});
  }

  void checkSteps() {
    for (uint32_t g = 0; g < nLanes_; ++g) {
      const uint32_t r = laneRank_[g];
      const auto& steps = lanePtr_[g]->steps;
      for (uint32_t i = 0; i < steps.size(); ++i) checkStep(g, i, r, steps[i]);
    }
  }

  void checkStep(uint32_t g, uint32_t i, uint32_t r, const Step& st) {
    if (const char* problem = protocolFlagProblem(st.kind, st.flags)) addStep(g, i, problem);
    switch (st.kind) {
      case StepKind::Copy:
      case StepKind::Reduce: {
        const bool reduce = st.kind == StepKind::Reduce;
        const char* kind = reduce ? "reduce" : "copy";
        if (st.count == 0) addStep(g, i, "count must be > 0");
        if (reduce && static_cast<uint8_t>(st.op) > static_cast<uint8_t>(RedOp::Min))
          addStep(g, i, "unknown reduction op " + str(static_cast<uint8_t>(st.op)));
        const bool dOk = refOk(g, i, st.dst, "dst");
        const bool aOk = refOk(g, i, st.a, "a");
        const bool bOk = !reduce || refOk(g, i, st.b, "b");
        if (!(dOk && aOk && bOk)) return;
        sameNodeOk(g, i, st.dst, "dst", kind);
        sameNodeOk(g, i, st.a, "a", kind);
        if (reduce) sameNodeOk(g, i, st.b, "b", kind);
        if (reduce)
          dtypesAgree(g, i, {{"dst", &st.dst}, {"a", &st.a}, {"b", &st.b}});
        else
          dtypesAgree(g, i, {{"dst", &st.dst}, {"a", &st.a}});
        rangeOk(g, i, st.dst, "dst", st.count);
        rangeOk(g, i, st.a, "a", st.count);
        if (reduce) rangeOk(g, i, st.b, "b", st.count);
        overlapOk(g, i, st.dst, st.a, "a", st.count);
        if (reduce) overlapOk(g, i, st.dst, st.b, "b", st.count);
        return;
      }
      case StepKind::Put:
      case StepKind::ProxyPut: {
        const bool proxy = st.kind == StepKind::ProxyPut;
        if (!proxy && st.count == 0) addStep(g, i, "count must be > 0 (use a signal step to signal without data)");
        if (proxy && st.count == 0 && !(st.flags & kStepSignal))
          addStep(g, i, "count 0 without kStepSignal does nothing (a zero-count proxyput must signal)");
        const bool dOk = refOk(g, i, st.dst, "dst");
        const bool aOk = refOk(g, i, st.a, "a");
        if (dOk) {
          const bool sameNode = s_.nodeOf[st.dst.rank] == s_.nodeOf[r];
          if (!proxy && st.dst.rank == r)
            addStep(g, i, "dst is on the executing rank " + str(r) + ": a put writes a peer's buffer (use copy)");
          else if (!proxy && !sameNode)
            addStep(g, i,
                    "dst rank " + str(st.dst.rank) + " is on node " + str(s_.nodeOf[st.dst.rank]) +
                        ", not this rank's node " + str(s_.nodeOf[r]) + ": use proxyput across nodes");
          else if (proxy && sameNode)
            addStep(g, i,
                    "dst rank " + str(st.dst.rank) + " is on this rank's node " + str(s_.nodeOf[r]) +
                        ": a proxyput crosses nodes (use put inside a node)");
        }
        if (aOk && st.a.rank != r)
          addStep(g, i, "source a is on rank " + str(st.a.rank) + ", expected the executing rank " + str(r));
        if (dOk && aOk) {
          dtypesAgree(g, i, {{"dst", &st.dst}, {"a", &st.a}});
          rangeOk(g, i, st.dst, "dst", st.count);
          rangeOk(g, i, st.a, "a", st.count);
        }
        if ((st.flags & kStepSignal) && flagOk(g, i, st.flag, "signal")) {
          if (!proxy && s_.nodeOf[st.flag.rank] != s_.nodeOf[r])
            addStep(g, i,
                    "signals flag " + str(st.flag.id) + " of rank " + str(st.flag.rank) +
                        " on another node: a put can only signal NVLink-reachable ranks");
          if (proxy && st.flag.rank != st.dst.rank)
            addStep(g, i,
                    "signals flag " + str(st.flag.id) + " of rank " + str(st.flag.rank) +
                        ", but a proxyput's signal is delivered with the data to dst rank " + str(st.dst.rank));
          recordIncrement(g, i, st);
        }
        return;
      }
      case StepKind::Signal:
        if (flagOk(g, i, st.flag, "target")) recordIncrement(g, i, st);
        return;
      case StepKind::Wait: {
        if (st.value == 0) addStep(g, i, "wait threshold must be >= 1 (got 0)");
        if (!flagOk(g, i, st.flag, "awaited")) return;
        if (const std::string problem = waitRankProblem(st, r); !problem.empty()) {
          addStep(g, i, problem);
          indexError_ = true;  // the simulation models only own-rank waits
          return;
        }
        const uint32_t f = flagIds_.get(st.flag);
        flagOf_[stepBase_[g] + i] = f;
        waits_.push_back(WaitRec{g, i, f, st.value});
        return;
      }
      case StepKind::Gemm: checkGemm(g, i, st); return;
      case StepKind::Barrier:
        if (const std::string problem = barrierProblem(s_, st); !problem.empty()) {
          addStep(g, i, problem);
          indexError_ = true;
          return;
        }
        barriers_.push_back(BarrierRec{st.aux, r, g, i});
        return;
    }
    addStep(g, i, "unknown step kind " + str(static_cast<uint8_t>(st.kind)));
    indexError_ = true;
  }

  void checkGemm(uint32_t g, uint32_t i, const Step& st) {
    bool ok = true;
    if (st.aux >= s_.gemms.size()) {
      addStep(g, i, "gemm index " + str(st.aux) + " out of range (" + str(s_.gemms.size()) + " gemm shapes)");
      indexError_ = true;
      ok = false;
    }
    const bool dOk = refOk(g, i, st.dst, "C (dst)");
    const bool aOk = refOk(g, i, st.a, "A (a)");
    const bool bOk = refOk(g, i, st.b, "B (b)");
    if (!(dOk && aOk && bOk)) return;
    sameNodeOk(g, i, st.dst, "C (dst)", "gemm");
    sameNodeOk(g, i, st.a, "A (a)", "gemm");
    sameNodeOk(g, i, st.b, "B (b)", "gemm");
    const DType da = s_.buffers[st.a.buffer].dtype, db = s_.buffers[st.b.buffer].dtype;
    if (da != db || da == DType::Float32)
      addStep(g, i,
              std::string("A and B must share one 16-bit dtype (bfloat16 or float16): A ") + bufName(st.a.buffer) +
                  " is " + toString(da) + ", B " + bufName(st.b.buffer) + " is " + toString(db));
    if (!ok) return;
    const GemmShape& gs = s_.gemms[st.aux];
    if (gs.m == 0 || gs.n == 0 || gs.k == 0) return;  // reported once for the shape
    const bool colB = st.flags & kStepBColMajor;
    const uint64_t needLdb = colB ? gs.k : gs.n;
    if (gs.ldb < needLdb)
      addStep(g, i,
              "gemms[" + str(st.aux) + "].ldb " + str(gs.ldb) + " < " + (colB ? "k " : "n ") + str(needLdb) +
                  " (B is " + (colB ? "column" : "row") + "-major)");
    else
      rangeOk(g, i, st.b, "B (b)", extentB(gs, colB));
    if (gs.lda >= gs.k) rangeOk(g, i, st.a, "A (a)", uint64_t{gs.m - 1} * gs.lda + gs.k);
    if (gs.ldc >= gs.n) rangeOk(g, i, st.dst, "C (dst)", uint64_t{gs.m - 1} * gs.ldc + gs.n);
  }

  static uint64_t extentB(const GemmShape& gs, bool colB) {
    return colB ? uint64_t{gs.n - 1} * gs.ldb + gs.k : uint64_t{gs.k - 1} * gs.ldb + gs.n;
  }

  // ---- phase C: flag and barrier accounting ------------------------------------------------------------
  void checkFlagAccounting() {
    const std::size_t nf = flagIds_.size();
    total_.assign(nf, 0);
    maxWait_.assign(nf, 0);
    hasWait_.assign(nf, 0);
    flagBroken_.assign(nf, 0);
    for (const Increment& inc : incs_) total_[inc.flag] = addSat(total_[inc.flag], inc.value);
    for (const WaitRec& w : waits_) {
      maxWait_[w.flag] = std::max(maxWait_[w.flag], w.value);
      hasWait_[w.flag] = 1;
    }
    for (const WaitRec& w : waits_) {
      const FlagRef f = flagIds_.ref(w.flag);
      const uint64_t sent = total_[w.flag];
      if (sent == 0) {
        addStep(
            w.lane, w.step,
            "waits on flag " + str(f.id) + " of rank " + str(f.rank) + " but no step ever signals it (dangling wait)");
        flagBroken_[w.flag] = 1;
      } else if (w.value > sent) {
        addStep(w.lane, w.step,
                "flag " + str(f.id) + " of rank " + str(f.rank) + " can never be satisfied: waits for >= " +
                    str(w.value) + " but only " + str(sent) + " increments are ever sent");
        flagBroken_[w.flag] = 1;
      }
    }
    for (uint32_t fi = 0; fi < nf; ++fi) {
      if (total_[fi] <= maxWait_[fi]) continue;
      const FlagRef f = flagIds_.ref(fi);
      add(f.rank, -1, -1,
          "flag " + str(f.id) + " of rank " + str(f.rank) + ": unmatched: " + str(total_[fi] - maxWait_[fi]) +
              " increments never awaited (" + str(total_[fi]) + " sent, " +
              (hasWait_[fi] ? "largest wait threshold " + str(maxWait_[fi]) : std::string("no lane waits on it")) +
              "); every flag must be fully consumed");
    }
  }

  void checkBarriers() {
    std::sort(barriers_.begin(), barriers_.end(), [](const BarrierRec& x, const BarrierRec& y) {
      return std::tie(x.id, x.rank, x.lane, x.step) < std::tie(y.id, y.rank, y.lane, y.step);
    });
    for (std::size_t begin = 0; begin < barriers_.size();) {
      std::size_t end = begin;
      while (end < barriers_.size() && barriers_[end].id == barriers_[begin].id) ++end;
      const uint32_t id = barriers_[begin].id;
      const uint32_t dense = static_cast<uint32_t>(barrierIds_.size());
      barrierIds_.push_back(id);
      barrierBroken_.push_back(0);
      uint32_t distinct = 0;
      std::string missing;
      uint32_t nMissing = 0, nextRank = 0;
      for (std::size_t k = begin; k < end; ++k) {
        const BarrierRec& b = barriers_[k];
        barrierDense_[stepKey(b.lane, b.step)] = dense;
        if (k > begin && barriers_[k - 1].rank == b.rank) {
          const BarrierRec& prev = barriers_[k - 1];
          addStep(b.lane, b.step,
                  "executes barrier " + str(id) + " again (rank " + str(b.rank) + " already reached it at " +
                      where(prev.lane, prev.step) + "); every rank executes each barrier exactly once");
          barrierBroken_[dense] = 1;
          continue;
        }
        ++distinct;
        for (; nextRank < b.rank; ++nextRank) noteMissing(missing, nMissing, nextRank);
        nextRank = b.rank + 1;
      }
      for (; nextRank < s_.nRanks; ++nextRank) noteMissing(missing, nMissing, nextRank);
      if (distinct < s_.nRanks) {
        add(-1, -1, -1,
            "barrier " + str(id) + ": ranks [" + missing + "] never execute it (" + str(nMissing) + " of " +
                str(s_.nRanks) + " ranks missing); every rank executes each barrier exactly once");
        barrierBroken_[dense] = 1;
      }
      begin = end;
    }
  }

  static void noteMissing(std::string& list, uint32_t& n, uint32_t rank) {
    if (n < 16) list += (n ? ", " : "") + str(rank);
    if (n == 16) list += ", ...";
    ++n;
  }

  uint64_t stepKey(uint32_t g, uint32_t i) const { return stepBase_[g] + i; }

  // ---- phase D: symbolic execution ---------------------------------------------------------------------
  using Waiter = std::pair<uint64_t, uint32_t>;  // (threshold, lane), min-heap by threshold

  void simulate() {
    const std::size_t nf = flagIds_.size();
    counter_.assign(nf, 0);
    waiters_.assign(nf, {});
    pc_.assign(nLanes_, 0);
    arrived_.assign(barrierIds_.size(), {});
    if (trackClocks_) prepareClocks();
    work_.clear();
    for (uint32_t g = nLanes_; g-- > 0;) work_.push_back(g);
    while (!work_.empty()) {
      const uint32_t g = work_.back();
      work_.pop_back();
      advance(g);
    }
    reportBlocked();
  }

  void advance(uint32_t g) {
    const auto& steps = lanePtr_[g]->steps;
    uint32_t& pc = pc_[g];
    while (pc < steps.size()) {
      const Step& st = steps[pc];
      switch (st.kind) {
        case StepKind::Wait: {
          const uint32_t f = flagOf_[stepKey(g, pc)];
          if (counter_[f] < st.value) {
            waiters_[f].emplace_back(st.value, g);
            std::push_heap(waiters_[f].begin(), waiters_[f].end(), std::greater<>());
            return;
          }
          if (trackClocks_) joinWait(g, pc, f, st.value);
          ++pc;
          break;
        }
        case StepKind::Barrier: {
          const uint32_t b = barrierDense_.at(stepKey(g, pc));
          auto& here = arrived_[b];
          here.push_back(g);
          if (here.size() < s_.nRanks) return;
          if (trackClocks_) joinBarrier(here);
          // Everyone (this lane included) leaves the barrier; the others resume from the worklist.
          for (uint32_t w : here) {
            ++pc_[w];
            if (w != g) work_.push_back(w);
          }
          here.clear();
          here.shrink_to_fit();
          break;
        }
        case StepKind::Signal:
        case StepKind::Put:
        case StepKind::ProxyPut: {
          const uint32_t f = flagOf_[stepKey(g, pc)];
          ++pc;
          if (f == kNone) break;  // a put without kStepSignal
          counter_[f] = addSat(counter_[f], st.value);
          auto& heap = waiters_[f];
          while (!heap.empty() && heap.front().first <= counter_[f]) {
            work_.push_back(heap.front().second);
            std::pop_heap(heap.begin(), heap.end(), std::greater<>());
            heap.pop_back();
          }
          break;
        }
        case StepKind::Copy:
        case StepKind::Reduce:
        case StepKind::Gemm: ++pc; break;
      }
    }
  }

  void reportBlocked() {
    for (uint32_t g = 0; g < nLanes_; ++g) {
      const auto& steps = lanePtr_[g]->steps;
      const uint32_t pc = pc_[g];
      if (pc >= steps.size()) continue;
      const Step& st = steps[pc];
      if (st.kind == StepKind::Wait) {
        const uint32_t f = flagOf_[stepKey(g, pc)];
        if (flagBroken_[f]) continue;  // already reported as dangling / unsatisfiable
        addStep(g, pc,
                "flag " + str(st.flag.id) + " >= " + str(st.value) + " never reached (final value " + str(counter_[f]) +
                    ")" + pendingSignallers(f));
      } else if (st.kind == StepKind::Barrier) {
        const uint32_t b = barrierDense_.at(stepKey(g, pc));
        if (barrierBroken_[b]) continue;
        std::vector<uint8_t> present(s_.nRanks, 0);
        for (uint32_t w : arrived_[b]) present[laneRank_[w]] = 1;
        std::string missing;
        uint32_t n = 0;
        for (uint32_t r = 0; r < s_.nRanks; ++r)
          if (!present[r]) noteMissing(missing, n, r);
        addStep(g, pc, "waits at barrier " + str(barrierIds_[b]) + ": ranks [" + missing + "] never arrive");
      }
    }
  }

  /// " (blocked senders: ...)" naming up to three increments that never ran: the other end of a cycle.
  std::string pendingSignallers(uint32_t f) {
    if (!grouped_) groupIncrements();
    std::string out;
    uint32_t n = 0;
    for (uint32_t k = incFlagBegin_[f]; k < incFlagBegin_[f + 1]; ++k) {
      const Increment& inc = incs_[k];
      if (pc_[inc.lane] > inc.step) continue;
      if (n < 3) out += (n ? "; " : "") + where(inc.lane, inc.step);
      ++n;
    }
    if (n == 0) return out;
    return "; its missing increments come from steps that never run: " + out +
           (n > 3 ? "; +" + str(n - 3) + " more" : "");
  }

  /// Counting sort of increments by flag (stable: keeps lane-major, program order within a flag) and the
  /// per-lane suffix sums the wait rule needs.
  void groupIncrements() {
    const std::size_t nf = flagIds_.size();
    incFlagBegin_.assign(nf + 1, 0);
    for (const Increment& inc : incs_) ++incFlagBegin_[inc.flag + 1];
    for (std::size_t f = 0; f < nf; ++f) incFlagBegin_[f + 1] += incFlagBegin_[f];
    std::vector<Increment> sorted(incs_.size());
    std::vector<uint32_t> fill(incFlagBegin_.begin(), incFlagBegin_.end() - 1);
    for (const Increment& inc : incs_) sorted[fill[inc.flag]++] = inc;
    incs_ = std::move(sorted);
    grouped_ = true;
    // Groups of one lane within a flag are contiguous; suffix sums run backwards over each group.
    groupBegin_.assign(nf + 1, 0);
    groups_.clear();
    for (std::size_t f = 0; f < nf; ++f) {
      groupBegin_[f] = static_cast<uint32_t>(groups_.size());
      for (uint32_t k = incFlagBegin_[f]; k < incFlagBegin_[f + 1];) {
        uint32_t e = k;
        while (e < incFlagBegin_[f + 1] && incs_[e].lane == incs_[k].lane) ++e;
        uint64_t suffix = 0;
        for (uint32_t j = e; j-- > k;) {
          suffix = addSat(suffix, incs_[j].value);
          incs_[j].suffix = suffix;
        }
        groups_.emplace_back(k, e);
        k = e;
      }
    }
    groupBegin_[nf] = static_cast<uint32_t>(groups_.size());
  }

  // ---- phase E: happens-before and races ---------------------------------------------------------------
  bool raceBudgetOk() {
    groupIncrements();
    uint64_t joins = 0;
    for (const WaitRec& w : waits_)
      joins = addSat(joins, uint64_t{nLanes_} * (groupBegin_[w.flag + 1] - groupBegin_[w.flag] + 1));
    joins = addSat(joins, uint64_t{nLanes_} * barriers_.size());
    const uint64_t entries = uint64_t{nLanes_} * (waits_.size() + barrierIds_.size());
    return entries <= kClockEntryBudget && joins <= kClockJoinBudget;
  }

  void prepareClocks() {
    pool_.clear();
    snaps_.assign(nLanes_, {});
    scratch_.assign(nLanes_, 0);
  }

  /// Offset of lane g's clock snapshot in effect at step i (the last one taken at a step < i).
  uint64_t snapAt(uint32_t g, uint32_t i) const {
    const auto& v = snaps_[g];
    auto it = std::lower_bound(v.begin(), v.end(), i,
                               [](const std::pair<uint32_t, uint64_t>& sn, uint32_t step) { return sn.first < step; });
    return it == v.begin() ? kNoSnap : std::prev(it)->second;
  }

  /// scratch_ := lane g's clock in effect right after its step i.
  void loadClock(uint32_t g, uint32_t i) {
    const uint64_t off = snapAt(g, i);
    if (off == kNoSnap)
      std::fill(scratch_.begin(), scratch_.end(), 0u);
    else
      std::copy(pool_.begin() + static_cast<std::ptrdiff_t>(off),
                pool_.begin() + static_cast<std::ptrdiff_t>(off + nLanes_), scratch_.begin());
    scratch_[g] = std::max(scratch_[g], i + 1);
  }

  /// scratch_ := max(scratch_, clock of lane g right after its step i).
  void joinClock(uint32_t g, uint32_t i) {
    const uint64_t off = snapAt(g, i);
    if (off != kNoSnap) {
      const uint32_t* src = pool_.data() + off;
      for (uint32_t l = 0; l < nLanes_; ++l) scratch_[l] = std::max(scratch_[l], src[l]);
    }
    scratch_[g] = std::max(scratch_[g], i + 1);
  }

  uint64_t storeScratch() {
    const uint64_t off = pool_.size();
    pool_.insert(pool_.end(), scratch_.begin(), scratch_.end());
    return off;
  }

  void joinWait(uint32_t g, uint32_t i, uint32_t f, uint64_t threshold) {
    loadClock(g, i);
    const uint64_t total = total_[f];
    const uint64_t slack = total >= threshold ? total - threshold : 0;
    for (uint32_t gi = groupBegin_[f]; gi < groupBegin_[f + 1]; ++gi) {
      const auto [b, e] = groups_[gi];
      // suffix is non-increasing along the group: find the last increment whose suffix exceeds the slack,
      // i.e. the latest increment of this lane without which the threshold is out of reach.
      if (incs_[b].suffix <= slack) continue;
      uint32_t lo = b, hi = e;  // invariant: incs_[lo].suffix > slack
      while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        if (incs_[mid].suffix > slack)
          lo = mid;
        else
          hi = mid;
      }
      joinClock(incs_[lo].lane, incs_[lo].step);
    }
    snaps_[g].emplace_back(i, storeScratch());
  }

  void joinBarrier(const std::vector<uint32_t>& lanes) {
    std::fill(scratch_.begin(), scratch_.end(), 0u);
    for (uint32_t w : lanes) joinClock(w, pc_[w]);
    const uint64_t off = storeScratch();  // one snapshot shared by every participant
    for (uint32_t w : lanes) snaps_[w].emplace_back(pc_[w], off);
  }

  /// Did access x (lane, step) complete before access y started?
  bool before(const Access& x, const Access& y) const {
    if (y.snap == kNoSnap) return false;
    return pool_[y.snap + x.lane] >= x.step + 1;
  }

  void checkRaces() {
    const uint64_t nBuf = s_.buffers.size();
    std::vector<Access> acc;
    bool overBudget = false;
    auto addRows = [&](uint32_t g, uint32_t i, uint64_t snap, const BufRef& ref, uint64_t rows, uint64_t width,
                       uint64_t ld, bool write) {
      if (rows == 0 || width == 0) return;
      if (ld == width) {  // contiguous: one interval
        width *= rows;
        rows = 1;
      }
      if (acc.size() + rows > kAccessBudget) {
        overBudget = true;
        return;
      }
      const uint64_t key = uint64_t{ref.rank} * nBuf + ref.buffer;
      for (uint64_t row = 0; row < rows; ++row)
        acc.push_back(Access{key, ref.offset + row * ld, ref.offset + row * ld + width, g, i, snap, write});
    };
    for (uint32_t g = 0; g < nLanes_ && !overBudget; ++g) {
      const auto& steps = lanePtr_[g]->steps;
      const auto& sn = snaps_[g];
      std::size_t next = 0;
      uint64_t snap = kNoSnap;
      for (uint32_t i = 0; i < steps.size(); ++i) {
        while (next < sn.size() && sn[next].first < i) snap = sn[next++].second;
        const Step& st = steps[i];
        switch (st.kind) {
          case StepKind::Copy:
          case StepKind::Put:
          case StepKind::ProxyPut:
            addRows(g, i, snap, st.dst, 1, st.count, st.count, true);
            addRows(g, i, snap, st.a, 1, st.count, st.count, false);
            break;
          case StepKind::Reduce:
            addRows(g, i, snap, st.dst, 1, st.count, st.count, true);
            addRows(g, i, snap, st.a, 1, st.count, st.count, false);
            addRows(g, i, snap, st.b, 1, st.count, st.count, false);
            break;
          case StepKind::Gemm: {
            const GemmShape& gs = s_.gemms[st.aux];
            const bool colB = st.flags & kStepBColMajor;
            addRows(g, i, snap, st.dst, gs.m, gs.n, gs.ldc, true);
            addRows(g, i, snap, st.a, gs.m, gs.k, gs.lda, false);
            if (colB)
              addRows(g, i, snap, st.b, gs.n, gs.k, gs.ldb, false);
            else
              addRows(g, i, snap, st.b, gs.k, gs.n, gs.ldb, false);
            break;
          }
          case StepKind::Signal:
          case StepKind::Wait:
          case StepKind::Barrier: break;
        }
      }
    }
    if (overBudget) {
      raceSkipped_ = "it would sort more than " + str(kAccessBudget) + " access intervals";
      return;
    }
    std::sort(acc.begin(), acc.end(),
              [](const Access& x, const Access& y) { return x.key != y.key ? x.key < y.key : x.lo < y.lo; });

    std::unordered_set<uint64_t> reported;
    std::vector<uint32_t> writes, reads;  // active intervals of the current (rank, buffer)
    auto check = [&](const Access& x, const Access& y) {
      if (x.lane == y.lane || before(x, y) || before(y, x)) return;
      const uint64_t kx = stepKey(x.lane, x.step), ky = stepKey(y.lane, y.step);
      const uint64_t pair = std::min(kx, ky) * (totalSteps_ + 1) + std::max(kx, ky);
      if (!reported.insert(pair).second) return;
      const uint32_t rank = static_cast<uint32_t>(x.key / nBuf);
      const auto buf = static_cast<uint16_t>(x.key % nBuf);
      add(laneRank_[y.lane], laneLocal_[y.lane], y.step,
          "race on rank " + str(rank) + " buffer " + bufName(buf) + " elements [" + str(std::max(x.lo, y.lo)) + ", " +
              str(std::min(x.hi, y.hi)) + "): " + where(x.lane, x.step) + " and " + where(y.lane, y.step) +
              " are not ordered by flags");
    };
    auto sweep = [&](std::vector<uint32_t>& active, const Access& cur) {
      for (std::size_t k = 0; k < active.size();) {
        const Access& other = acc[active[k]];
        if (other.hi <= cur.lo) {  // expired: every later access starts at or after cur.lo
          active[k] = active.back();
          active.pop_back();
          continue;
        }
        check(other, cur);
        ++k;
      }
    };
    for (std::size_t k = 0; k < acc.size(); ++k) {
      const Access& cur = acc[k];
      if (k == 0 || acc[k - 1].key != cur.key) {
        writes.clear();
        reads.clear();
      }
      sweep(writes, cur);
      if (cur.write) sweep(reads, cur);
      (cur.write ? writes : reads).push_back(static_cast<uint32_t>(k));
    }
  }

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

std::vector<ValidationIssue> validateImpl(const Schedule& s, const ValidateOptions& opt, uint64_t& suppressed,
                                          std::string* raceSkipped = nullptr) {
  Validator v(s, opt);
  auto issues = v.run(suppressed);
  if (raceSkipped) *raceSkipped = v.raceSkipped();
  return issues;
}

}  // namespace

std::vector<ValidationIssue> validateAll(const Schedule& s, const ValidateOptions& opt) {
  uint64_t suppressed = 0;
  auto issues = validateImpl(s, opt, suppressed);
  if (suppressed > 0) {
    ValidationIssue more;
    more.message = str(suppressed) + " further issues not listed (the first " + str(kMaxIssues) + " are above)";
    issues.push_back(std::move(more));
  }
  return issues;
}

std::string validate(const Schedule& s, const ValidateOptions& opt) {
  uint64_t suppressed = 0;
  std::string raceSkipped;
  const auto issues = validateImpl(s, opt, suppressed, &raceSkipped);
  if (issues.empty()) return raceSkipped;
  std::string msg = issues.front().message;
  const uint64_t more = issues.size() - 1 + suppressed;
  if (more > 0) msg += " (+" + str(more) + " more)";
  throw Error(ErrorCode::InvalidSchedule, msg);
}

}  // namespace mk

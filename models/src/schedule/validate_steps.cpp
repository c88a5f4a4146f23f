// mkernel — the schedule validator, phases A (structure: counts, buffers, lanes) and B (per-step rules: buffer
// references, ranges, dtypes, flags, Gemm shapes); the class is in validator.hpp.
#include <algorithm>
#include <array>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "mk/error.hpp"
#include "mk/schedule/check.hpp"
#include "mk/util/size.hpp"
#include "validator.hpp"

namespace mk::validation {

bool Validator::checkStructure() {
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
    if (!isDType(static_cast<uint8_t>(d.dtype)))
      add(-1, -1, -1, id + ": unknown dtype " + str(static_cast<uint8_t>(d.dtype)));
    if (static_cast<uint8_t>(d.kind) > static_cast<uint8_t>(BufferKind::InOut))
      add(-1, -1, -1, id + ": unknown buffer kind " + str(static_cast<uint8_t>(d.kind)));
    if (d.name.empty()) add(-1, -1, -1, id + ": a buffer name must not be empty (operands refer to it in JSON)");
    if (!names.insert(d.name).second) add(-1, -1, -1, id + ": duplicate buffer name");
  }
  std::unordered_set<std::string> extentNames;
  for (std::size_t e = 0; e < s_.extents.size(); ++e) {
    const ExtentDecl& d = s_.extents[e];
    const std::string id = "extents[" + str(e) + "] '" + d.name + "'";
    if (d.name.empty()) add(-1, -1, -1, id + ": an extent name must not be empty (steps refer to it in JSON)");
    if (!extentNames.insert(d.name).second) add(-1, -1, -1, id + ": duplicate extent name");
    if (d.bound == 0 || d.bound > kMaxElements)
      add(-1, -1, -1, id + ": bound must be in [1, 2^50] (got " + str(d.bound) + ")");
    if (!(d.expected >= 0 && d.expected <= static_cast<double>(d.bound)))
      add(-1, -1, -1,
          id + ": expected must be in [0, bound " + str(d.bound) + "] (got " + formatNumber(d.expected) + ")");
  }
  checkExtentSources();
  // Shapes a SwiGLU grouped GEMM runs write n / 2 columns of C (gemmOutCols); each step checks its own use.
  std::vector<bool> gated(s_.gemms.size(), false);
  for (const auto& lanes : s_.lanes)
    for (const Lane& lane : lanes)
      for (const Step& st : lane.steps)
        if (st.kind == StepKind::GroupedGemm && (st.flags & kStepSwiGLU))
          for (uint64_t h = 0; h < st.count && st.aux + h < gated.size(); ++h) gated[st.aux + h] = true;
  for (std::size_t gi = 0; gi < s_.gemms.size(); ++gi) {
    const GemmShape& g = s_.gemms[gi];
    const std::string id = "gemms[" + str(gi) + "]";
    if (std::string problem = extentProblem(g.extent, g.m, "m"); !problem.empty()) add(-1, -1, -1, id + ": " + problem);
    if (g.m == 0 || g.n == 0 || g.k == 0)
      add(-1, -1, -1, id + ": m, n, k must all be > 0 (got " + str(g.m) + ", " + str(g.n) + ", " + str(g.k) + ")");
    if (g.lda < g.k) add(-1, -1, -1, id + ": lda " + str(g.lda) + " < k " + str(g.k) + " (A is row-major m x k)");
    if (!gated[gi] && g.ldc < g.n)
      add(-1, -1, -1, id + ": ldc " + str(g.ldc) + " < n " + str(g.n) + " (C is row-major m x n)");
  }
  checkAttentionShapes();
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

void Validator::indexLanes() {
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

bool Validator::refOk(uint32_t g, uint32_t i, const BufRef& ref, const char* name) {
  bool ok = true;
  if (ref.rank >= s_.nRanks) {
    addStep(g, i, std::string(name) + " rank " + str(ref.rank) + " out of range (nRanks " + str(s_.nRanks) + ")");
    ok = false;
  }
  if (ref.buffer >= s_.buffers.size()) {
    addStep(
        g, i,
        std::string(name) + " buffer id " + str(ref.buffer) + " out of range (" + str(s_.buffers.size()) + " buffers)");
    ok = false;
  }
  if (!ok) indexError_ = true;
  return ok;
}

void Validator::rangeOk(uint32_t g, uint32_t i, const BufRef& ref, const char* name, uint64_t extent) {
  const uint64_t have = s_.buffers[ref.buffer].count[ref.rank];
  if (ref.offset > have || extent > have - ref.offset) {
    const std::string end =
        ref.offset > std::numeric_limits<uint64_t>::max() - extent ? std::string("overflow") : str(ref.offset + extent);
    addStep(g, i,
            std::string(name) + " elements [" + str(ref.offset) + ", " + end + ") exceed buffer " +
                bufName(ref.buffer) + " on rank " + str(ref.rank) + " (" + str(have) + " elements)");
  }
}

bool Validator::operandsOnNode(uint32_t g, uint32_t i, const Step& st, const std::array<const char*, 3>& names,
                               const char* kind) {
  const bool dOk = refOk(g, i, st.dst, names[0]);
  const bool aOk = refOk(g, i, st.a, names[1]);
  const bool bOk = refOk(g, i, st.b, names[2]);
  if (!(dOk && aOk && bOk)) return false;
  sameNodeOk(g, i, st.dst, names[0], kind);
  sameNodeOk(g, i, st.a, names[1], kind);
  sameNodeOk(g, i, st.b, names[2], kind);
  return true;
}

void Validator::sameNodeOk(uint32_t g, uint32_t i, const BufRef& ref, const char* name, const char* kind) {
  const uint32_t r = laneRank_[g];
  if (s_.nodeOf[ref.rank] != s_.nodeOf[r])
    addStep(g, i,
            std::string(name) + " is on rank " + str(ref.rank) + " (node " + str(s_.nodeOf[ref.rank]) +
                "), not on this rank's node " + str(s_.nodeOf[r]) + ": " + kind +
                " operands must be on the executing rank's node");
}

void Validator::dtypesAgree(uint32_t g, uint32_t i, std::initializer_list<std::pair<const char*, const BufRef*>> ops) {
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

void Validator::overlapOk(uint32_t g, uint32_t i, const BufRef& dst, const BufRef& src, const char* srcName,
                          uint64_t n) {
  if (dst.rank != src.rank || dst.buffer != src.buffer || dst.offset == src.offset || n == 0) return;
  const uint64_t lo = std::max(dst.offset, src.offset);
  const uint64_t hi = std::min(addSat(dst.offset, n), addSat(src.offset, n));
  if (lo < hi)
    addStep(g, i,
            std::string("dst [") + str(dst.offset) + ", " + str(addSat(dst.offset, n)) + ") partially overlaps " +
                srcName + " [" + str(src.offset) + ", " + str(addSat(src.offset, n)) + ") in buffer " +
                bufName(dst.buffer) + ": in-place operands must coincide exactly");
}

bool Validator::flagOk(uint32_t g, uint32_t i, const FlagRef& f, const char* what) {
  const std::vector<std::string> problems = flagProblems(s_, f, what);
  for (const std::string& problem : problems) addStep(g, i, problem);
  if (!problems.empty()) indexError_ = true;
  return problems.empty();
}

void Validator::recordIncrement(uint32_t g, uint32_t i, const Step& st) {
  if (st.value == 0) addStep(g, i, "signal increment must be >= 1 (got 0)");
  const uint32_t f = flagIds_.get(st.flag);
  flagOf_[stepBase_[g] + i] = f;
  incs_.push_back(Increment{f, g, i, st.value, 0});
}

void Validator::checkSteps() {
  for (uint32_t g = 0; g < nLanes_; ++g) {
    const uint32_t r = laneRank_[g];
    const auto& steps = lanePtr_[g]->steps;
    for (uint32_t i = 0; i < steps.size(); ++i) checkStep(g, i, r, steps[i]);
  }
}

std::string Validator::extentProblem(uint32_t extent, uint64_t full, const char* what) const {
  if (extent == kNoExtent) return {};
  if (extent >= s_.extents.size())
    return "extent index " + str(extent) + " out of range (" + str(s_.extents.size()) + " extents)";
  const ExtentDecl& d = s_.extents[extent];
  if (d.bound == 0 || full % d.bound != 0)
    return std::string(what) + " " + str(full) + " is not a multiple of the bound " + str(d.bound) + " of extent '" +
           d.name + "' (" + what + " is the bound's units times a fixed size)";
  return {};
}

void Validator::checkStep(uint32_t g, uint32_t i, uint32_t r, const Step& st) {
  if (const char* problem = protocolFlagProblem(st.kind, st.flags)) addStep(g, i, problem);
  if (st.extent != kNoExtent) {
    if (!(kindInfo(st.kind).fields & kFieldExtent))
      addStep(g, i,
              std::string("a ") + toString(st.kind) + " step takes no runtime extent (only copy, reduce, put, " +
                  "proxyput, gather, route, combine; a gemm's extent is on its shape)");
    else if (std::string problem = extentProblem(st.extent, st.count, "count"); !problem.empty())
      addStep(g, i, problem);
    else if (st.kind == StepKind::Reduce && isRedOp(static_cast<uint8_t>(st.op)) &&
             redOpInfo(st.op).shape == RedOpShape::LseRows && st.aux > 0 &&
             (st.count / s_.extents[st.extent].bound) % (uint64_t{st.aux} + 1) != 0)
      addStep(g, i, "count per unit of extent '" + s_.extents[st.extent].name + "' is not a whole number of rows");
    else
      extentSourceOk(g, i, r, st.extent);
  }
  switch (st.kind) {
    case StepKind::Copy:
    case StepKind::Reduce: {
      const bool reduce = st.kind == StepKind::Reduce;
      const char* kind = reduce ? "reduce" : "copy";
      if (st.count == 0) addStep(g, i, "count must be > 0");
      if (reduce && !isRedOp(static_cast<uint8_t>(st.op)))
        addStep(g, i, "unknown reduction op " + str(static_cast<uint8_t>(st.op)));
      else if (reduce && redOpInfo(st.op).shape == RedOpShape::LseRows &&
               (st.aux == 0 || st.count % (uint64_t{st.aux} + 1) != 0))
        addStep(g, i,
                std::string(toString(st.op)) + " reads rows of row = " + str(st.aux) +
                    " values and their log-sum-exp: row must be > 0 and count " + str(st.count) +
                    " a multiple of row + 1");
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
      if (const DType t = s_.buffers[st.dst.buffer].dtype;
          reduce && isDType(static_cast<uint8_t>(t)) && dtypeInfo(t).integer)
        addStep(g, i,
                std::string("a reduce does not take ") + toString(t) +
                    " operands (integers are routing data: moved, gathered and read as extents, never reduced)");
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
      if (!flagOk(g, i, st.flag, "target")) return;
      if (s_.nodeOf[st.flag.rank] != s_.nodeOf[r])
        addStep(g, i,
                "signals flag " + str(st.flag.id) + " of rank " + str(st.flag.rank) + " on node " +
                    str(s_.nodeOf[st.flag.rank]) + ", not this rank's node " + str(s_.nodeOf[r]) +
                    ": a signal reaches NVLink peers only (signal across nodes with a proxyput of 0 elements)");
      recordIncrement(g, i, st);
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
    case StepKind::Gemm:
      if (st.flags & kStepSwiGLU) addStep(g, i, "swiglu: only a grouped-gemm step carries the SwiGLU epilogue");
      checkGemm(g, i, st);
      return;
    case StepKind::GroupedGemm:
      if (st.count == 0) addStep(g, i, "count (groups) must be > 0");
      if (st.count > s_.gemms.size() || st.aux > s_.gemms.size() - st.count) {
        addStep(g, i,
                "groups " + str(st.aux) + " .. " + str(st.aux + st.count - 1) + " run past the gemm shapes (" +
                    str(s_.gemms.size()) + ")");
        indexError_ = true;
        return;
      }
      forEachGemm(s_.gemms, st, [&](const Step& one) { checkGemm(g, i, one); });
      return;
    case StepKind::Barrier:
      if (const std::string problem = barrierProblem(s_, st); !problem.empty()) {
        addStep(g, i, problem);
        indexError_ = true;
        return;
      }
      barriers_.push_back(BarrierRec{st.aux, r, g, i});
      return;
    case StepKind::Route: checkRoute(g, i, r, st); return;
    case StepKind::Gather: checkGather(g, i, st); return;
    case StepKind::Combine: checkCombine(g, i, st); return;
    case StepKind::Attention: checkAttention(g, i, st); return;
    case StepKind::AttentionGrad: checkAttentionGrad(g, i, st); return;
  }
  addStep(g, i, "unknown step kind " + str(static_cast<uint8_t>(st.kind)));
  indexError_ = true;
}

void Validator::checkGemm(uint32_t g, uint32_t i, const Step& st) {
  bool ok = true;
  if (st.aux >= s_.gemms.size()) {
    addStep(g, i, "gemm index " + str(st.aux) + " out of range (" + str(s_.gemms.size()) + " gemm shapes)");
    indexError_ = true;
    ok = false;
  }
  if (!operandsOnNode(g, i, st, {"C (dst)", "A (a)", "B (b)"}, "gemm")) return;
  const DType da = s_.buffers[st.a.buffer].dtype, db = s_.buffers[st.b.buffer].dtype;
  if (da != db || (da != DType::BFloat16 && da != DType::Float16))
    addStep(g, i,
            std::string("A and B must share one 16-bit dtype (bfloat16 or float16): A ") + bufName(st.a.buffer) +
                " is " + toString(da) + ", B " + bufName(st.b.buffer) + " is " + toString(db));
  if (const DType dc = s_.buffers[st.dst.buffer].dtype; isDType(static_cast<uint8_t>(dc)) && dtypeInfo(dc).integer)
    addStep(g, i,
            "C (dst) " + bufName(st.dst.buffer) + " is " + toString(dc) + ": a gemm writes a floating-point type");
  if (!ok) return;
  const GemmShape& gs = s_.gemms[st.aux];
  extentSourceOk(g, i, laneRank_[g], gs.extent);
  if (gs.m == 0 || gs.n == 0 || gs.k == 0) return;  // reported once for the shape
  const bool colB = st.flags & kStepBColMajor;
  const uint64_t needLdb = colB ? gs.k : gs.n;
  if (gs.ldb < needLdb)
    addStep(g, i,
            "gemms[" + str(st.aux) + "].ldb " + str(gs.ldb) + " < " + (colB ? "k " : "n ") + str(needLdb) + " (B is " +
                (colB ? "column" : "row") + "-major)");
  else
    rangeOk(g, i, st.b, "B (b)", extentB(gs, colB));
  if (gs.lda >= gs.k) rangeOk(g, i, st.a, "A (a)", uint64_t{gs.m - 1} * gs.lda + gs.k);
  const uint32_t cols = gemmOutCols(gs, st.flags);
  if (st.flags & kStepSwiGLU) {
    if (st.kind != StepKind::Gemm || gs.n % 2 != 0 || (st.flags & kStepAccumulate))
      addStep(g, i,
              "swiglu: gemms[" + str(st.aux) + "] needs an even n (interleaved gate and up columns; got " + str(gs.n) +
                  ") and no accumulate");
    if (gs.ldc < cols)
      addStep(g, i,
              "gemms[" + str(st.aux) + "].ldc " + str(gs.ldc) + " < n / 2 " + str(cols) +
                  " (C of a SwiGLU epilogue is m x n / 2)");
  } else if (gs.ldc < gs.n) {  // passed the shape check for a SwiGLU use only
    addStep(g, i, "gemms[" + str(st.aux) + "].ldc " + str(gs.ldc) + " < n " + str(gs.n) + " (C is row-major m x n)");
  }
  if (gs.ldc >= cols) rangeOk(g, i, st.dst, "C (dst)", uint64_t{gs.m - 1} * gs.ldc + cols);
}

uint64_t Validator::extentB(const GemmShape& gs, bool colB) {
  return colB ? uint64_t{gs.n - 1} * gs.ldb + gs.k : uint64_t{gs.k - 1} * gs.ldb + gs.n;
}

}  // namespace mk::validation

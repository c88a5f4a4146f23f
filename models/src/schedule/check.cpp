// mkernel — the shared structure checks (check.hpp).
#include "mk/schedule/check.hpp"

#include "mk/error.hpp"

namespace mk {

namespace {

std::string str(uint64_t v) { return std::to_string(v); }

}  // namespace

std::string nodeOfProblem(const Schedule& s) {
  if (s.nodeOf.size() == s.nRanks) return {};
  return "nodeOf has " + str(s.nodeOf.size()) + " entries, expected nRanks = " + str(s.nRanks);
}

std::string laneListProblem(const Schedule& s) {
  if (s.lanes.size() == s.nRanks) return {};
  return "lanes has " + str(s.lanes.size()) + " ranks, expected nRanks = " + str(s.nRanks);
}

std::string bufferCountProblem(const Schedule& s, std::size_t buffer) {
  const BufferDecl& d = s.buffers[buffer];
  if (d.count.size() == s.nRanks) return {};
  return "buffers[" + str(buffer) + "] '" + d.name + "': has " + str(d.count.size()) +
         " per-rank counts, expected nRanks = " + str(s.nRanks);
}

void requireRankTables(const Schedule& s) {
  for (const std::string& problem : {nodeOfProblem(s), laneListProblem(s)})
    if (!problem.empty()) throw Error(ErrorCode::InvalidSchedule, "schedule: " + problem);
}

std::vector<std::string> flagProblems(const Schedule& s, FlagRef f, const char* what) {
  std::vector<std::string> problems;
  if (f.rank >= s.nRanks)
    problems.push_back(std::string(what) + " flag rank " + str(f.rank) + " out of range (nRanks " + str(s.nRanks) +
                       ")");
  if (f.id >= s.nFlags)
    problems.push_back(std::string(what) + " flag id " + str(f.id) + " out of range (nFlags " + str(s.nFlags) + ")");
  return problems;
}

std::string waitRankProblem(const Step& st, uint32_t rank) {
  if (!kindInfo(st.kind).waits || !(kindInfo(st.kind).fields & kFieldFlag) || st.flag.rank == rank) return {};
  return "waits on flag " + str(st.flag.id) + " of rank " + str(st.flag.rank) +
         "; a lane may only wait on its own rank's (" + str(rank) + ") flags";
}

std::string barrierProblem(const Schedule& s, const Step& st) {
  if (!kindInfo(st.kind).waits || !(kindInfo(st.kind).fields & kFieldAux) || st.aux < s.nBarriers) return {};
  return "barrier id " + str(st.aux) + " out of range (nBarriers " + str(s.nBarriers) + ")";
}

void requireSyncReferences(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step) {
  const Step& st = s.lanes[rank][lane].steps[step];
  std::vector<std::string> problems;
  if (const char* problem = protocolFlagProblem(st.kind, st.flags)) problems.emplace_back(problem);
  const StepKindInfo& info = kindInfo(st.kind);
  if (info.fields & kFieldSignal) {
    if (st.flags & kStepSignal) problems = flagProblems(s, st.flag, "signal");
  } else if ((info.fields & kFieldFlag) && !info.waits) {
    problems = flagProblems(s, st.flag, "target");
  } else if (info.fields & kFieldFlag) {
    problems = flagProblems(s, st.flag, "awaited");
    problems.push_back(waitRankProblem(st, rank));
  } else if (info.waits) {
    problems.push_back(barrierProblem(s, st));
  }
  for (const std::string& problem : problems)
    if (!problem.empty()) throw Error(ErrorCode::InvalidSchedule, describeStep(s, rank, lane, step) + ": " + problem);
}

}  // namespace mk

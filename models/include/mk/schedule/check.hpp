// mkernel — the structure checks every consumer of a schedule makes before it indexes it by rank, flag or
// barrier, in one wording: validate() lists these problems among its own; the uncontended timeline, the
// simulator's replay and the CPU executor, which run schedules validate() may never have seen, throw the first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk {

/// "nodeOf has 3 entries, expected nRanks = 2"; empty when nodeOf has an entry per rank.
std::string nodeOfProblem(const Schedule& s);
/// "lanes has 1 ranks, expected nRanks = 2"; empty when there is a lane list per rank.
std::string laneListProblem(const Schedule& s);
/// "buffers[2] 'recv': has 3 per-rank counts, expected nRanks = 2"; empty when buffer `buffer` has a count per
/// rank.
std::string bufferCountProblem(const Schedule& s, std::size_t buffer);
/// Throws Error(InvalidSchedule) "schedule: <problem>" for the first of nodeOfProblem and laneListProblem.
void requireRankTables(const Schedule& s);

/// "<what> flag rank 5 out of range (nRanks 2)", "<what> flag id 2 out of range (nFlags 2)": the problems of
/// flag `f` named by a step as `what` ("signal" for a Put or ProxyPut, "target" for a Signal, "awaited" for
/// a Wait).
std::vector<std::string> flagProblems(const Schedule& s, FlagRef f, const char* what);
/// "waits on flag 0 of rank 1; a lane may only wait on its own rank's (0) flags"; empty unless `st` is a Wait
/// of `rank` on another rank's flag.
std::string waitRankProblem(const Step& st, uint32_t rank);
/// "barrier id 1 out of range (nBarriers 1)"; empty unless `st` is a Barrier with an id out of range.
std::string barrierProblem(const Schedule& s, const Step& st);
/// Throws Error(InvalidSchedule) "<describeStep>: <problem>" for the first problem of the flag or barrier that
/// step `step` of (rank, lane) names: its flag (a Signal, a Wait, a Put or ProxyPut with kStepSignal), a Wait
/// on another rank's flag, its barrier. The rank tables must be sound (requireRankTables).
void requireSyncReferences(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step);

}  // namespace mk

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

#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/schedule/check.hpp"
#include "validator.hpp"

namespace mk {
namespace validation {

std::vector<ValidationIssue> Validator::run(uint64_t& suppressed) {
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

void Validator::add(int64_t rank, int64_t lane, int64_t step, std::string msg) {
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

void Validator::addStep(uint32_t g, uint32_t i, const std::string& msg) {
  if (issues_.size() >= kMaxIssues) {
    ++suppressed_;
    return;
  }
  add(laneRank_[g], laneLocal_[g], i, where(g, i) + ": " + msg);
}

}  // namespace validation

namespace {

using validation::kMaxIssues;
using validation::str;
using validation::Validator;

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

// mkernel — the schedule validator, phases C (flag and barrier accounting) and D (symbolic execution: every lane
// run to completion or the blocked waits reported); the class is in validator.hpp.
#include <algorithm>
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
#include "validator.hpp"

namespace mk::validation {

void Validator::checkFlagAccounting() {
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

void Validator::checkBarriers() {
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

void Validator::noteMissing(std::string& list, uint32_t& n, uint32_t rank) {
  if (n < 16) list += (n ? ", " : "") + str(rank);
  if (n == 16) list += ", ...";
  ++n;
}

void Validator::simulate() {
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

void Validator::advance(uint32_t g) {
  const auto& steps = lanePtr_[g]->steps;
  uint32_t& pc = pc_[g];
  while (pc < steps.size()) {
    const Step& st = steps[pc];
    const StepKindInfo& info = kindInfo(st.kind);
    if (info.waits && (info.fields & kFieldFlag)) {
      const uint32_t f = flagOf_[stepKey(g, pc)];
      if (counter_[f] < st.value) {
        waiters_[f].emplace_back(st.value, g);
        std::push_heap(waiters_[f].begin(), waiters_[f].end(), std::greater<>());
        return;
      }
      if (trackClocks_) joinWait(g, pc, f, st.value);
      ++pc;
    } else if (info.waits) {
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
    } else {
      // Every other kind runs through; the increment of a signalling step (recorded by checkStep) lands.
      const uint32_t f = flagOf_[stepKey(g, pc)];
      ++pc;
      if (f != kNone) {
        counter_[f] = addSat(counter_[f], st.value);
        auto& heap = waiters_[f];
        while (!heap.empty() && heap.front().first <= counter_[f]) {
          work_.push_back(heap.front().second);
          std::pop_heap(heap.begin(), heap.end(), std::greater<>());
          heap.pop_back();
        }
      }
    }
  }
}

void Validator::reportBlocked() {
  for (uint32_t g = 0; g < nLanes_; ++g) {
    const auto& steps = lanePtr_[g]->steps;
    const uint32_t pc = pc_[g];
    if (pc >= steps.size()) continue;
    const Step& st = steps[pc];
    const StepKindInfo& info = kindInfo(st.kind);
    if (!info.waits) continue;
    if (info.fields & kFieldFlag) {
      const uint32_t f = flagOf_[stepKey(g, pc)];
      if (flagBroken_[f]) continue;  // already reported as dangling / unsatisfiable
      addStep(g, pc,
              "flag " + str(st.flag.id) + " >= " + str(st.value) + " never reached (final value " + str(counter_[f]) +
                  ")" + pendingSignallers(f));
    } else {
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

std::string Validator::pendingSignallers(uint32_t f) {
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

void Validator::groupIncrements() {
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

}  // namespace mk::validation

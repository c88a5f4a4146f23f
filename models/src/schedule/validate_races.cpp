// mkernel — the schedule validator, phase E: happens-before by vector clocks and the race check (the wait rule is
// explained at the top of validate.cpp); the class is in validator.hpp.
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
#include "mk/schedule/route.hpp"
#include "validator.hpp"

namespace mk::validation {

bool Validator::raceBudgetOk() {
  groupIncrements();
  uint64_t joins = 0;
  for (const WaitRec& w : waits_)
    joins = addSat(joins, uint64_t{nLanes_} * (groupBegin_[w.flag + 1] - groupBegin_[w.flag] + 1));
  joins = addSat(joins, uint64_t{nLanes_} * barriers_.size());
  const uint64_t entries = uint64_t{nLanes_} * (waits_.size() + barrierIds_.size());
  return entries <= kClockEntryBudget && joins <= kClockJoinBudget;
}

void Validator::prepareClocks() {
  pool_.clear();
  snaps_.assign(nLanes_, {});
  scratch_.assign(nLanes_, 0);
}

uint64_t Validator::snapAt(uint32_t g, uint32_t i) const {
  const auto& v = snaps_[g];
  auto it = std::lower_bound(v.begin(), v.end(), i,
                             [](const std::pair<uint32_t, uint64_t>& sn, uint32_t step) { return sn.first < step; });
  return it == v.begin() ? kNoSnap : std::prev(it)->second;
}

void Validator::loadClock(uint32_t g, uint32_t i) {
  const uint64_t off = snapAt(g, i);
  if (off == kNoSnap)
    std::fill(scratch_.begin(), scratch_.end(), 0u);
  else
    std::copy(pool_.begin() + static_cast<std::ptrdiff_t>(off),
              pool_.begin() + static_cast<std::ptrdiff_t>(off + nLanes_), scratch_.begin());
  scratch_[g] = std::max(scratch_[g], i + 1);
}

void Validator::joinClock(uint32_t g, uint32_t i) {
  const uint64_t off = snapAt(g, i);
  if (off != kNoSnap) {
    const uint32_t* src = pool_.data() + off;
    for (uint32_t l = 0; l < nLanes_; ++l) scratch_[l] = std::max(scratch_[l], src[l]);
  }
  scratch_[g] = std::max(scratch_[g], i + 1);
}

uint64_t Validator::storeScratch() {
  const uint64_t off = pool_.size();
  pool_.insert(pool_.end(), scratch_.begin(), scratch_.end());
  return off;
}

void Validator::joinWait(uint32_t g, uint32_t i, uint32_t f, uint64_t threshold) {
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

void Validator::joinBarrier(const std::vector<uint32_t>& lanes) {
  std::fill(scratch_.begin(), scratch_.end(), 0u);
  for (uint32_t w : lanes) joinClock(w, pc_[w]);
  const uint64_t off = storeScratch();  // one snapshot shared by every participant
  for (uint32_t w : lanes) snaps_[w].emplace_back(pc_[w], off);
}

bool Validator::before(const Access& x, const Access& y) const {
  if (y.snap == kNoSnap) return false;
  return pool_[y.snap + x.lane] >= x.step + 1;
}

void Validator::checkRaces() {
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
      const StepKindInfo& info = kindInfo(st.kind);
      // A runtime extent with a source is read on the executing rank when the step starts (extent.hpp).
      auto readsExtent = [&](uint32_t extent) {
        if (extent >= s_.extents.size() || !s_.extents[extent].sourced()) return;
        const ExtentDecl& d = s_.extents[extent];
        addRows(g, i, snap, bufRef(laneRank_[g], d.sourceBuffer, d.sourceElement), 1, 1, 1, false);
      };
      if (info.fields & kFieldExtent) readsExtent(st.extent);
      switch (info.extent) {
        case StepExtent::Flat:  // dst is written, a and b are read
          addRows(g, i, snap, st.dst, 1, st.count, st.count, true);
          addRows(g, i, snap, st.a, 1, st.count, st.count, false);
          if (info.fields & kFieldB) addRows(g, i, snap, st.b, 1, st.count, st.count, false);
          break;
        case StepExtent::Tile:
          forEachGemm(s_.gemms, st, [&](const Step& one) {
            const GemmShape& gs = s_.gemms[one.aux];
            const bool colB = one.flags & kStepBColMajor;
            readsExtent(gs.extent);
            addRows(g, i, snap, one.dst, gs.m, gemmOutCols(gs, one.flags), gs.ldc, true);
            addRows(g, i, snap, one.a, gs.m, gs.k, gs.lda, false);
            if (colB)
              addRows(g, i, snap, one.b, gs.n, gs.k, gs.ldb, false);
            else
              addRows(g, i, snap, one.b, gs.k, gs.n, gs.ldb, false);
          });
          break;
        case StepExtent::Indexed: {  // gather, combine: the whole region its indices may name counts as read
          const IndexedElements n = indexedElements(st);
          addRows(g, i, snap, st.dst, 1, n.dst, n.dst, true);
          addRows(g, i, snap, st.a, 1, n.a, n.a, false);
          if (info.fields & kFieldB) addRows(g, i, snap, st.b, 1, n.b, n.b, false);
          break;
        }
        case StepExtent::Attention: {  // per batch: a block of rows of Q, K, V and out
          const AttentionShape& sh = s_.attentions[st.aux];
          const uint64_t qRow = uint64_t{sh.qHeads} * sh.headDim, kvRow = uint64_t{sh.kvHeads} * sh.headDim;
          const uint64_t oRow = uint64_t{sh.qHeads} * sh.outRow();
          BufRef v = st.b;
          v.offset += sh.vOffset;
          addRows(g, i, snap, st.a, sh.batch, sh.sq * qRow, sh.ldq * qRow, false);
          addRows(g, i, snap, st.b, sh.batch, sh.skv * kvRow, sh.ldkv * kvRow, false);
          addRows(g, i, snap, v, sh.batch, sh.skv * kvRow, sh.ldkv * kvRow, false);
          if (st.kind == StepKind::Attention) {
            addRows(g, i, snap, st.dst, sh.batch, sh.sq * oRow, sh.ldo * oRow, true);
            break;
          }
          // attention-grad: dO beside Q; dK, dV and dQ added to (read and written), the forward's rows read
          BufRef dO = st.a, dv = st.dst, rows = st.dst, dq = st.dst;
          dO.offset += sh.doOffset;
          dv.offset += sh.vOffset;
          rows.offset = sh.rowsAt;
          dq.offset = sh.dqAt;
          addRows(g, i, snap, dO, sh.batch, sh.sq * qRow, sh.ldq * qRow, false);
          addRows(g, i, snap, rows, sh.batch, sh.sq * oRow, sh.ldo * oRow, false);
          addRows(g, i, snap, st.dst, sh.batch, sh.skv * kvRow, sh.ldkv * kvRow, true);
          addRows(g, i, snap, dv, sh.batch, sh.skv * kvRow, sh.ldkv * kvRow, true);
          addRows(g, i, snap, dq, sh.batch, sh.sq * qRow, sh.ldq * qRow, true);
          break;
        }
        case StepExtent::None: break;
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

}  // namespace mk::validation

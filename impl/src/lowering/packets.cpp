// LL packet plan (see packets.hpp).
#include "lowering/packets.hpp"

#include <string>

#include "mk/error.hpp"

namespace mk::runtime {
namespace {

bool isPacketPut(const Step& st) { return st.kind == StepKind::Put && (st.flags & kStepLL) != 0; }

/// Does `st` raise flag `f` without being a packet Put (a Signal, a plain Put's signal, a ProxyPut's)?
bool plainSignal(const Step& st) { return incrementsFlag(st.kind, st.flags) && !isPacketPut(st); }

}  // namespace

bool hasPacketPuts(const Schedule& s) {
  for (const auto& lanes : s.lanes)
    for (const Lane& lane : lanes)
      for (const Step& st : lane.steps)
        if (isPacketPut(st)) return true;
  return false;
}

PacketPlan planPackets(const Schedule& s, uint64_t areaLimitBytes) {
  using Key = std::pair<uint32_t, uint32_t>;  // (receiver rank, flag id)
  // 1. Which flags could take packets: every signal into them is a packet Put's, and one Wait takes them all.
  std::map<Key, uint64_t> increments;  // flags packet Puts raise -> the sum of their increments
  std::map<Key, bool> eligible;
  auto forEachStep = [&](auto&& f) {
    for (uint32_t q = 0; q < s.lanes.size(); ++q)
      for (uint32_t l = 0; l < s.lanes[q].size(); ++l)
        for (uint32_t i = 0; i < s.lanes[q][l].steps.size(); ++i) f(q, l, i, s.lanes[q][l].steps[i]);
  };
  forEachStep([&](uint32_t, uint32_t, uint32_t, const Step& st) {
    if (!isPacketPut(st) || !(st.flags & kStepSignal)) return;
    const Key k{st.flag.rank, st.flag.id};
    increments[k] += st.value;
    eligible.emplace(k, st.flag.rank == st.dst.rank && st.dst.rank < s.nRanks && st.dst.buffer < s.buffers.size());
  });
  std::map<Key, uint32_t> waits;
  forEachStep([&](uint32_t, uint32_t, uint32_t, const Step& st) {
    const Key k{st.flag.rank, st.flag.id};
    const auto it = eligible.find(k);
    if (it == eligible.end()) return;
    if (plainSignal(st)) it->second = false;
    if (st.kind == StepKind::Wait && (++waits[k] > 1 || st.value != increments[k])) it->second = false;
  });
  for (auto& [k, ok] : eligible)
    if (waits.find(k) == waits.end()) ok = false;
  // 2. The packet Puts into eligible flags, in (sender, lane, step) order: each receiver's area grows by their
  // packets. The others run as plain Puts with their flag (the bit is then only the cost model's flavour).
  PacketPlan plan;
  plan.areaBytes.assign(s.nRanks, 0);
  forEachStep([&](uint32_t q, uint32_t l, uint32_t i, const Step& st) {
    if (!isPacketPut(st) || !(st.flags & kStepSignal)) return;
    const Key k{st.flag.rank, st.flag.id};
    if (!eligible.at(k)) return;
    const uint32_t r = st.dst.rank;
    const DType dt = s.buffers[st.dst.buffer].dtype;
    const uint64_t bytes = packetBytes(st.count * dtypeSize(dt));
    if (plan.areaBytes[r] + bytes > areaLimitBytes)
      throw Error(ErrorCode::Unsupported,
                  describeStep(s, q, l, i) + ": rank " + std::to_string(r) + " would receive " +
                      std::to_string(plan.areaBytes[r] + bytes) + " bytes of LL packets in one op; its packet area " +
                      "holds " + std::to_string(areaLimitBytes) + " (send the larger puts with the simple protocol)");
    plan.sendOffset[{q, l, i}] = plan.areaBytes[r];
    plan.runs[k].push_back(PacketRun{st.dst, st.count, dt, plan.areaBytes[r], q, st.value});
    plan.areaBytes[r] += bytes;
  });
  return plan;
}

}  // namespace mk::runtime

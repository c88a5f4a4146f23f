// mkernel — internal: where the LL packets of a schedule go (docs/gpu-engine.md, "LL packets").
//
// A Put with kStepLL travels as 16-byte packets {data lo, epoch, data hi, epoch} into the receiver's packet area
// (RankState::packets), and the receiver's Wait on the Put's flag becomes the unpacking of those packets into the
// Put's destination: no fence between data and flag, no flag at all. Both sides must agree on where each Put's
// packets land, so the plan is made from the whole schedule, the same way on every rank.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk::runtime {

/// Packet bytes that carry `dataBytes` bytes of data.
constexpr uint64_t packetBytes(uint64_t dataBytes) noexcept { return (dataBytes + 7) / 8 * 16; }

/// One LL Put as its receiver unpacks it.
struct PacketRun {
  BufRef dst;          ///< where the data goes (on the receiver)
  uint64_t count = 0;  ///< elements
  DType dtype = DType::Float32;
  uint64_t areaOffset = 0;  ///< byte offset in the receiver's packet area
  uint32_t sender = 0;
  uint64_t value = 0;  ///< the flag increment the Put stood for
};

struct PacketPlan {
  /// (sender rank, lane, step) -> byte offset in the receiver's packet area.
  std::map<std::tuple<uint32_t, uint32_t, uint32_t>, uint64_t> sendOffset;
  /// (receiver rank, flag id) -> the runs its one Wait on that flag unpacks, in (sender, lane, step) order.
  std::map<std::pair<uint32_t, uint32_t>, std::vector<PacketRun>> runs;
  std::vector<uint64_t> areaBytes;  ///< per receiver rank

  bool empty() const noexcept { return sendOffset.empty(); }
};

/// True when any Put of `s` asks for LL packets.
bool hasPacketPuts(const Schedule& s);

/// Plan the LL Puts of `s` (all ranks' lanes must be present). A flag takes packets when every signal into it is a
/// packet Put's (with the data on the flag's rank) and exactly one Wait, whose threshold is the sum of their
/// increments, takes them all; the packet Puts into any other flag run as plain Puts (the bit is then only the cost
/// model's flavour, as in the layered nccl-* schedules). Throws Error(Unsupported) naming the step when a
/// receiver's packets would pass `areaLimitBytes`.
PacketPlan planPackets(const Schedule& s, uint64_t areaLimitBytes);

}  // namespace mk::runtime

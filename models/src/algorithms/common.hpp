// mkernel — internal: helpers shared by the generators of this folder (one file per algorithm: its setup, its
// emit function and its closed form).
//
// Conventions of the all-reduce generators (allreduce_*.cpp, docs/algorithms-allreduce.md):
//  * Every channel owns a slice `part` of [0, count) and its own lanes and flags; channels never touch
//    each other's elements, so they need no synchronisation between them.
//  * Lanes of one rank on one channel (ChannelLanes; created on first use, so no rank owns an empty lane):
//      mover    Intra      NVLink Puts (and the local Copy of p = 1)
//      reducer  Intra      Waits for arriving data and every Reduce; signals its own rank when a result
//                          is ready for a mover / sender
//      sender   InterSend  ProxyPuts to other nodes (the builder turns a cross-node put into a ProxyPut)
//    Splitting data movement from reduction lets the Reduce of chunk k overlap the transfer of chunk k+1;
//    a Signal to one's own rank is the only cross-lane ordering.
//  * Flags: every flag has one purpose and is one of three kinds: per chunk (its increments, from any
//    number of sources, all carry that chunk), fed by one lane of one rank in program order (a running
//    count is an exact threshold), or awaited once at its total (the mix of senders cannot matter).
//  * Pieces that come out empty (counts that do not divide evenly) emit nothing on every side, so flag
//    accounting stays consistent without zero-byte messages.
//  * Peer order is staggered: rank r visits (r + i) % p for i = 1..p-1.
//
// Conventions of the all-gather, reduce-scatter, broadcast and all-to-all generators (allgather_*.cpp,
// reducescatter_*.cpp, broadcast_*.cpp, alltoall_*.cpp, docs/algorithms-collectives.md):
//  * a channel owns elements `part` of every block (the per-rank block of allgather, the per-rank output
//    block of reducescatter, the per-peer block of alltoall, the whole buffer of broadcast) and has its own
//    lanes; inside a channel each transfer is cut into K' = min(chunks, part.size) chunks (chunkRanges);
//  * NVLink puts run on the Intra lane, cross-node puts on the InterSend lane, local copies and reductions
//    that nothing sends from on the Compute lane, waits for data nothing is forwarded from on the lane of
//    the link it arrived by (Intra or InterRecv);
//  * a flag only ever receives increments from one lane of one rank, in order, so a threshold t means "the
//    first t transfers of that lane to me have landed" and no mix of chunks can reach it early;
//  * peers are visited in staggered order (rank r starts with r + 1), so no rank is everyone's first target.
#pragma once

#include <cstdint>
#include <vector>

#include "builder.hpp"

namespace mk::detail {

/// Channels that actually emit (generate() never hands out an empty part): min(channels, count).
uint32_t effectiveChannels(const GenContext& ctx);

/// a x b; throws Error(InvalidArgument) naming `what` when a scratch size overflows 64 bits.
uint64_t checkedProduct(uint64_t a, uint64_t b, const char* what);

// ---- the all-reduce family -----------------------------------------------------------------------------------

/// The mover, reducer and sender lanes of one channel (see the file comment).
class ChannelLanes {
 public:
  ChannelLanes(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel) : b_(b), ctx_(ctx), channel_(channel) {}
  /// The Intra lane that puts over NVLink.
  uint32_t mover(uint32_t rank) { return b_.lane(rank, LaneRole::Intra, channel_); }
  /// The Intra lane that waits and reduces. The builder keys lanes by (rank, role, channel), so this second
  /// Intra lane of the channel gets a channel key no real channel uses.
  uint32_t reducer(uint32_t rank) { return b_.lane(rank, LaneRole::Intra, ctx_.opt.channels + channel_); }
  /// The InterSend lane that puts to other nodes.
  uint32_t sender(uint32_t rank) { return b_.lane(rank, LaneRole::InterSend, channel_); }
  /// The lane that moves data from `rank` to `peer`: mover inside a node, sender across nodes.
  uint32_t to(uint32_t rank, uint32_t peer) { return ctx_.sameNode(rank, peer) ? mover(rank) : sender(rank); }

 private:
  ScheduleBuilder& b_;
  const GenContext& ctx_;
  uint32_t channel_;
};

/// Final wait of `rank`'s reducer for everything sent to `flag`; emits nothing (and creates no lane) when
/// nothing was sent, e.g. when every piece this rank would receive is empty.
void waitForAll(ScheduleBuilder& b, ChannelLanes& lanes, uint32_t rank, uint32_t flag);

/// LL packets (GenOptions::protocol = LL) on the puts of the engine's small-op generators (one-shot, two-shot,
/// direct all-gather), whose every flag is raised by puts only and waited on once for all of them — what the GPU
/// engine needs to send them as packets (impl/src/lowering/packets.hpp). Only when every rank shares one node:
/// the engine's packets travel over NVLink. Setups call setupPacketPuts; closed forms price through packetPriced.
bool packetPuts(const GenOptions& opt, const std::vector<uint32_t>& nodeOf);
void setupPacketPuts(GenContext& ctx);
/// `cost` under the packet protocol's put prices (protocolView: the same rule the timeline applies per step) when
/// the generator sends packets, else `cost` as is.
CostEstimate packetPriced(const CostContext& c, CostEstimate (*cost)(const CostContext&));

/// p = 1: the all-reduce of one rank is a copy of its input (on the mover lane).
void emitLocalCopy(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part);

/// dst <- x(0) op x(1) op ... op x(n-1), strictly left to right (n >= 2), on `lane` of `rank`.
template <class Operand>
void reduceChain(ScheduleBuilder& b, uint32_t rank, uint32_t lane, BufRef dst, uint32_t n, Operand x, uint64_t count) {
  b.reduce(rank, lane, dst, x(0), x(1), count);
  for (uint32_t i = 2; i < n; ++i) b.reduce(rank, lane, dst, dst, x(i), count);
}

// ---- the gather/scatter family -------------------------------------------------------------------------------

/// The chunks of one channel's part: K' = min(chunks, part.size) near-equal pieces (never an empty one).
std::vector<Range> chunkRanges(Range part, uint32_t chunks);

/// Lane role of a transfer from `from` to `to`: Intra inside a node, InterSend across nodes.
LaneRole sendRole(const GenContext& ctx, uint32_t from, uint32_t to);

/// Lane role a rank waits on for data from `from` that it does not forward: Intra or InterRecv.
LaneRole recvRole(const GenContext& ctx, uint32_t from, uint32_t to);
/// Every peer of `rank`, in the order a direct exchange sends to them: the peers of its node in ring order from
/// rank + 1 (as always), then the other nodes' ranks starting with the next node and, within a node, with the
/// peer of its own local index. Senders of one node thus start on different GPUs of each remote node (each remote
/// NIC takes one sender at a time, not all of them at once: no incast), where a global ring order would send every
/// rank of a node to the same remote rank first.
std::vector<uint32_t> directSendOrder(const GenContext& ctx, uint32_t rank);

/// Same-node peers of `rank` in staggered order: the ranks above it, then the ones below (what visiting
/// (rank + i) % p for i = 1..p-1 and keeping the same-node ones gives, since nodeRanks is ascending).
std::vector<uint32_t> localPeers(const GenContext& ctx, uint32_t rank);

/// Owner of rail g on `node`: the rank with local index g, or g % size on a smaller node.
uint32_t railOwner(const GenContext& ctx, uint32_t node, uint32_t g);

/// Rails `rank` owns, ascending: its local index l, then l + size, l + 2 size, ... below maxLocal.
std::vector<uint32_t> railsOf(const GenContext& ctx, uint32_t rank);

/// Declare "scratch" as `slots` slots of `count` elements (none for 0 slots).
void addScratch(ScheduleBuilder& b, GenContext& ctx, uint64_t slots);

/// Copy this channel's part of a local block on the Compute lane (p = 1, and the own block of gathers).
void localCopy(ScheduleBuilder& b, const GenContext& ctx, uint32_t rank, uint32_t channel, uint64_t dstOffset,
               uint16_t srcBuf, uint64_t srcOffset, uint64_t count);

/// The direct exchange of allgather_direct.cpp, which all-to-all reuses (alltoall_direct.cpp): every rank
/// sends one block to every peer (all-gather: its input; all-to-all: its input block j to rank j), always into
/// the receiver's output block r, and waits for one block from every peer.
void emitDirectExchange(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part, bool allToAll);
/// Its closed form.
CostEstimate costDirectExchange(const CostContext& c);

}  // namespace mk::detail

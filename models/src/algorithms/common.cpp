// mkernel — helpers shared by the generators (common.hpp).
#include "common.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"

namespace mk::detail {

uint32_t effectiveChannels(const GenContext& ctx) {
  return static_cast<uint32_t>(std::min<uint64_t>(ctx.opt.channels, ctx.spec.count));
}

bool railRingsApply(const GenContext& ctx) {
  const uint32_t G = ctx.maxLocal, p = ctx.nRanks;
  if (ctx.nNodes() < 2 || G < 2 || p % G != 0) return false;
  for (uint32_t r = 0; r < p; ++r)
    if (ctx.nodeOf[r] != r / G || ctx.localIndex[r] != r % G) return false;
  return true;
}

std::vector<uint32_t> ringOrder(const GenContext& ctx, uint32_t channel) {
  const uint32_t p = ctx.nRanks;
  std::vector<uint32_t> order(p);
  if (!ctx.railRings) {
    for (uint32_t i = 0; i < p; ++i) order[i] = i;
    return order;
  }
  const uint32_t G = ctx.maxLocal, M = ctx.nNodes();
  for (uint32_t k = 0; k < M; ++k) {
    const uint32_t first = static_cast<uint32_t>((channel % G + G - k % G) % G);
    for (uint32_t j = 0; j < G; ++j) order[k * G + j] = ctx.nodeRanks[k][(first + j) % G];
  }
  return order;
}

double ringNetworkLanes(const GenContext& ctx, double channels) {
  if (!ctx.railRings) return channels;
  const double G = ctx.maxLocal;
  return std::ceil(channels / G);
}

double ringNvlinkLanes(const GenContext& ctx, double channels) {
  if (!ctx.railRings) return channels;
  return channels - std::floor(channels / ctx.maxLocal);
}

uint64_t checkedProduct(uint64_t a, uint64_t b, const char* what) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a)
    throw Error(ErrorCode::InvalidArgument, std::string("scratch size of ") + what + " overflows 64 bits (" +
                                                std::to_string(a) + " x " + std::to_string(b) + " elements)");
  return a * b;
}

void waitForAll(ScheduleBuilder& b, ChannelLanes& lanes, uint32_t rank, uint32_t flag) {
  const uint64_t n = b.signalsSent(rank, flag);
  if (n > 0) b.wait(rank, lanes.reducer(rank), flag, n);
}

bool packetPuts(const GenOptions& opt, const std::vector<uint32_t>& nodeOf) {
  return opt.protocol == Protocol::LL &&
         std::all_of(nodeOf.begin(), nodeOf.end(), [&](uint32_t n) { return n == nodeOf.front(); });
}

void setupPacketPuts(GenContext& ctx) {
  if (packetPuts(ctx.opt, ctx.nodeOf)) ctx.putFlags = kStepLL;
}

CostEstimate packetPriced(const CostContext& c, CostEstimate (*cost)(const CostContext&)) {
  if (!packetPuts(c.opt, c.gen.nodeOf)) return cost(c);
  const Profile view = protocolView(c.profile, kStepLL);
  CostEstimate e = cost(CostContext{c.spec, c.opt, c.topo, c.gen, view});
  e.formula = "ll packets: " + e.formula;
  return e;
}

void emitLocalCopy(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  ChannelLanes lanes(b, ctx, channel);
  b.copy(0, lanes.mover(0), bufRef(0, ctx.output, part.begin), bufRef(0, ctx.input, part.begin), part.size);
}

std::vector<Range> chunkRanges(Range part, uint32_t chunks) {
  const auto k = static_cast<uint32_t>(std::min<uint64_t>(chunks, part.size));
  std::vector<Range> out;
  out.reserve(k);
  for (uint32_t i = 0; i < k; ++i) out.push_back(splitRange(part, k, i));
  return out;
}

LaneRole sendRole(const GenContext& ctx, uint32_t from, uint32_t to) {
  return ctx.sameNode(from, to) ? LaneRole::Intra : LaneRole::InterSend;
}

LaneRole recvRole(const GenContext& ctx, uint32_t from, uint32_t to) {
  return ctx.sameNode(from, to) ? LaneRole::Intra : LaneRole::InterRecv;
}

std::vector<uint32_t> directSendOrder(const GenContext& ctx, uint32_t rank) {
  const uint32_t p = ctx.nRanks, nodes = ctx.nNodes();
  std::vector<uint32_t> local, remote;
  for (uint32_t i = 1; i < p; ++i) {
    const uint32_t j = (rank + i) % p;
    (ctx.sameNode(rank, j) ? local : remote).push_back(j);
  }
  // Remote peers by (node distance, local index distance), both cyclic.
  auto key = [&](uint32_t j) {
    const uint32_t size = ctx.nodeSize(ctx.nodeOf[j]);
    return std::make_pair((ctx.nodeOf[j] + nodes - ctx.nodeOf[rank]) % nodes,
                          (ctx.localIndex[j] + size - ctx.localIndex[rank] % size) % size);
  };
  std::stable_sort(remote.begin(), remote.end(), [&](uint32_t a, uint32_t b) { return key(a) < key(b); });
  local.insert(local.end(), remote.begin(), remote.end());
  return local;
}

std::vector<uint32_t> localPeers(const GenContext& ctx, uint32_t rank) {
  const auto& mates = ctx.nodeRanks[ctx.nodeOf[rank]];
  const uint32_t me = ctx.localIndex[rank];
  std::vector<uint32_t> out;
  out.reserve(mates.size());
  for (std::size_t i = 1; i < mates.size(); ++i) out.push_back(mates[(me + i) % mates.size()]);
  return out;
}

uint32_t railOwner(const GenContext& ctx, uint32_t node, uint32_t g) {
  const auto& mates = ctx.nodeRanks[node];
  return mates[g % mates.size()];
}

std::vector<uint32_t> railsOf(const GenContext& ctx, uint32_t rank) {
  std::vector<uint32_t> out;
  for (uint32_t g = ctx.localIndex[rank]; g < ctx.maxLocal; g += ctx.nodeSize(ctx.nodeOf[rank])) out.push_back(g);
  return out;
}

void addScratch(ScheduleBuilder& b, GenContext& ctx, uint64_t slots) {
  if (slots == 0) return;
  ctx.scratch = b.addBuffer("scratch", ctx.spec.dtype, BufferKind::Scratch, slots * ctx.spec.count);
}

void localCopy(ScheduleBuilder& b, const GenContext& ctx, uint32_t rank, uint32_t channel, uint64_t dstOffset,
               uint16_t srcBuf, uint64_t srcOffset, uint64_t count) {
  b.copy(rank, b.lane(rank, LaneRole::Compute, channel), bufRef(rank, ctx.output, dstOffset),
         bufRef(rank, srcBuf, srcOffset), count);
}

}  // namespace mk::detail

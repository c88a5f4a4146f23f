// mkernel — nccl-tree: NCCL's tree all-reduce (docs/algorithms-nccl.md, "tree").
//
// The ranks of a node form a chain (local index i's parent is i - 1); the chain heads (local index 0) of the M
// nodes form a binary tree, two of them (NCCL's double binary tree): channel c uses tree c % 2, tree 0 the heap
// over the nodes in order (node n's parent (n - 1) / 2), tree 1 the same heap over the nodes in reverse order,
// so that most nodes that are inner in one tree are leaves in the other and both halves of the data keep every
// NIC busy. Every slice goes up (each rank adds its children's partials to its input and sends the sum to its
// parent) and then down (the root's sum is forwarded to the children), slices pipelined. Across nodes, with several
// ranks on every node, channel pair c / 2 starts its chains at local GPU (c / 2) mod G instead (headOf), so the
// pairs' heads, which send across nodes, sit on different GPUs and NICs as NCCL's trees do.
//
// Lanes per rank and channel: the reducer (waits for its children's partials, reduces into output, signals its
// own rank), the up lane (sends the partial, or the input on a leaf, to the parent's scratch slot for this
// child), two down lanes (NVLink children, network children) that forward the final slice. Flags: one per
// child slot (fed by that child's up lane, in slice order), `reduced` (own reducer), `down` (the parent's down
// lane): each has one source lane, so running counts are exact thresholds. A rank's output holds its partial
// until the parent's final slice overwrites it, which happens only after the parent received that partial.
#include <algorithm>
#include <cmath>

#include "closed_form.hpp"
#include "common.hpp"
#include "mk/algorithms/nccl.hpp"
#include "mk/cost/step_cost.hpp"

namespace mk::detail {
namespace {

constexpr uint32_t kMaxChildren = 3;  ///< a chain child and two tree children

/// Parent and children of one rank in tree `tree` (0 or 1).
struct TreeLinks {
  int parent = -1;
  std::vector<uint32_t> children;  ///< the chain child first, then the tree children
};

/// The local index channel `ch`'s chains start at (its node heads): NCCL puts each tree channel pair on a NIC of
/// its own, so under rail rings pair ch / 2 is headed by local GPU (ch / 2) mod G; local GPU 0 otherwise.
uint32_t headOf(const GenContext& ctx, uint32_t ch) { return ctx.railRings ? (ch / 2) % ctx.maxLocal : 0; }

/// Parent and children of one rank in tree `tree` (0 or 1) whose chains start at local index `head`.
TreeLinks treeLinks(const GenContext& ctx, uint32_t rank, uint32_t tree, uint32_t head) {
  TreeLinks t;
  const uint32_t node = ctx.nodeOf[rank], m = ctx.nNodes();
  const auto& mates = ctx.nodeRanks[node];
  const auto size = static_cast<uint32_t>(mates.size());
  auto mate = [&](uint32_t n, uint32_t at) { return ctx.nodeRanks[n][(head + at) % ctx.nodeSize(n)]; };
  const uint32_t li = (ctx.localIndex[rank] + size - head % size) % size;  // position in the chain
  if (li + 1 < size) t.children.push_back(mate(node, li + 1));
  if (li > 0) {
    t.parent = static_cast<int>(mate(node, li - 1));
    return t;
  }
  auto pos = [&](uint32_t n) { return tree == 0 ? n : m - 1 - n; };
  auto nodeAt = [&](uint32_t i) { return tree == 0 ? i : m - 1 - i; };
  const uint32_t i = pos(node);
  if (i > 0) t.parent = static_cast<int>(mate(nodeAt((i - 1) / 2), 0));
  for (uint32_t c : {2 * i + 1, 2 * i + 2})
    if (c < m) t.children.push_back(mate(nodeAt(c), 0));
  return t;
}

uint32_t slotIn(const GenContext& ctx, uint32_t parent, uint32_t child, uint32_t tree, uint32_t head) {
  const auto kids = treeLinks(ctx, parent, tree, head).children;
  return static_cast<uint32_t>(std::find(kids.begin(), kids.end(), child) - kids.begin());
}

void setupNcclTree(ScheduleBuilder& b, GenContext& ctx) {
  ctx.putFlags = protocolFlags(ctx.opt.protocol);
  ctx.railRings = railRingsApply(ctx);
  if (ctx.nRanks > 1) addScratch(b, ctx, kMaxChildren);
}

void emitNcclTree(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  if (p == 1) return emitLocalCopy(b, ctx, ch, part);
  const uint16_t scratch = scratchBuffer(ctx);
  const uint64_t count = ctx.spec.count;
  const uint32_t tree = ch % 2, keys = ctx.opt.channels, head = headOf(ctx, ch);
  const auto chunks = chunkRanges(part, ctx.opt.chunks);
  const std::vector<uint32_t> upArrived = b.newFlags(kMaxChildren);
  const uint32_t reduced = b.newFlag(), down = b.newFlag();
  for (uint32_t r = 0; r < p; ++r) {
    const TreeLinks t = treeLinks(ctx, r, tree, head);
    const bool root = t.parent < 0, leaf = t.children.empty();
    const uint32_t parent = root ? 0 : static_cast<uint32_t>(t.parent);
    const uint32_t slot = root ? 0 : slotIn(ctx, parent, r, tree, head);
    auto reducer = [&] { return b.lane(r, LaneRole::Intra, keys + ch); };
    auto up = [&] { return b.lane(r, sendRole(ctx, r, parent), ch); };
    auto downLane = [&](uint32_t child) {
      return ctx.sameNode(r, child) ? b.lane(r, LaneRole::Intra, 2 * keys + ch)
                                    : b.lane(r, LaneRole::InterSend, keys + ch);
    };
    for (uint64_t k = 0; k < chunks.size(); ++k) {
      const Range u = chunks[k];
      if (!leaf) {
        for (uint32_t s = 0; s < t.children.size(); ++s) b.wait(r, reducer(), upArrived[s], k + 1);
        const BufRef dst = bufRef(r, ctx.output, u.begin);
        reduceChain(
            b, r, reducer(), dst, static_cast<uint32_t>(t.children.size()) + 1,
            [&](uint32_t i) {
              return i == 0 ? bufRef(r, ctx.input, u.begin) : bufRef(r, scratch, (i - 1) * count + u.begin);
            },
            u.size);
        b.signal(r, reducer(), r, reduced);
      }
      if (!root) {
        if (!leaf) b.wait(r, up(), reduced, k + 1);
        const BufRef src = bufRef(r, leaf ? ctx.input : ctx.output, u.begin);
        b.put(r, up(), bufRef(parent, scratch, slot * count + u.begin), src, u.size, upArrived[slot]);
      }
      if (!leaf) {
        const uint32_t ready = root ? reduced : down;
        std::vector<uint32_t> waited;
        for (uint32_t c : t.children) {
          const uint32_t lane = downLane(c);
          if (std::find(waited.begin(), waited.end(), lane) == waited.end()) {
            b.wait(r, lane, ready, k + 1);
            waited.push_back(lane);
          }
          b.put(r, lane, bufRef(c, ctx.output, u.begin), bufRef(r, ctx.output, u.begin), u.size, down);
        }
      }
    }
  }
  // A leaf ends with the final slices its parent forwards.
  for (uint32_t r = 0; r < p; ++r) {
    const TreeLinks t = treeLinks(ctx, r, tree, head);
    if (t.children.empty() && t.parent >= 0)
      b.waitAllSent(r, b.lane(r, sendRole(ctx, r, static_cast<uint32_t>(t.parent)), ch), down);
  }
}

/// Pipelined tree: the first slice goes up the chain and the heap, each hop a put then (at the receiver) the
/// children's reductions and a lane hand-off; the other K - 1 slices follow at the pace of the slowest stage; the
/// last one comes down the same hops as puts. An estimate of the timeline's longest path, not a bound:
/// docs/algorithms-nccl.md.
CostEstimate costNcclTree(const CostContext& c) {
  const Protocol proto = c.opt.protocol == Protocol::Auto ? Protocol::Simple : c.opt.protocol;
  const Profile view = protocolView(layeredProfile(c.profile, proto), protocolFlags(proto));
  const CostContext vc{c.spec, c.opt, c.topo, c.gen, view};
  ChunkPrices x(vc);
  const GenContext& g = c.gen;
  if (railRingsApply(g)) {
    // Heads spread over the GPUs (headOf): a head carries the network lanes of its channel pairs only, an up and
    // a down lane each; every rank's up and down lanes of all channels share its NVLink (in the steady state of
    // the pipeline both run).
    const double perHead = 2 * std::ceil(x.channels / (2.0 * g.maxLocal));
    x.net.bw *= 2 * std::min(x.channels, perHead) / x.channels;
    x.nvl.bw *= 2;
  }
  if (g.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  // The chain inside the largest node (NVLink hops, one child each) and the heap over the nodes (network hops;
  // a head reduces its chain child and up to two tree children).
  const double chain = double(g.maxLocal - 1);
  const bool multi = g.nNodes() > 1;
  const double height = multi ? std::floor(std::log2(double(g.nNodes()))) : 0;
  const double headKids = (g.maxLocal > 1 ? 1.0 : 0.0) + std::min(2.0, double(g.nNodes() - 1));
  const Term flag{view.localFlagUs, 0, 0};
  const Term chainStage = x.nvl + x.reduce + flag;
  const Term heapStage = x.net + x.netLand + x.reduce * headKids + flag;
  const Term pace = multi ? maxOf({x.nvl, x.net, x.reduce * headKids + flag}) : maxOf({x.nvl, x.reduce + flag});
  CostEstimate e = x.finish(
      chainStage * chain + heapStage * height + pace * (x.chunks - 1) + x.nvl * chain + (x.net + x.netLand) * height,
      "nccl-tree/" + std::string(toString(proto)) +
          ": t0 + (G-1)*(T_nvl + R + F) + h*(T_net + c*R + F) + (K-1)*max(T_nvl, T_net, c*R + F)"
          " + (G-1)*T_nvl + h*T_net, h = floor(log2 M), c = a head's children");
  return e;
}

}  // namespace

AlgorithmDef ncclTree() {
  return {CollOp::AllReduce,
          "nccl-tree",
          "NCCL's tree: a chain inside each node, a double binary tree over the nodes, slices up then down",
          setupNcclTree,
          emitNcclTree,
          costNcclTree,
          /*peersTouchUser=*/false};
}

}  // namespace mk::detail

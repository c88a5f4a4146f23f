#include "builder.hpp"

#include <algorithm>
#include <limits>

#include "mk/error.hpp"
#include "mk/schedule/pack.hpp"

namespace mk::detail {

Range splitRange(Range r, uint32_t parts, uint32_t i) noexcept {
  const uint64_t base = r.size / parts;
  const uint64_t extra = r.size % parts;
  const uint64_t begin = r.begin + i * base + std::min<uint64_t>(i, extra);
  return Range{begin, base + (i < extra ? 1 : 0)};
}

void checkInterPhase(InterPhase inter) {
  if (static_cast<uint8_t>(inter) > static_cast<uint8_t>(InterPhase::BruckHalf))
    throw Error(ErrorCode::InvalidArgument, "inter must be ring, rhd, bruck, bruck-half or auto (got " +
                                                std::to_string(static_cast<unsigned>(inter)) + ")");
}

GenContext makeContext(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt) {
  if (nodeOf.empty()) throw Error(ErrorCode::InvalidArgument, "a schedule needs at least 1 rank (nodeOf is empty)");
  if (nodeOf.size() > std::numeric_limits<uint32_t>::max() / 2)
    throw Error(ErrorCode::InvalidArgument, "too many ranks: " + std::to_string(nodeOf.size()));
  if (opt.chunks == 0 || opt.chunks > kMaxChunks)
    throw Error(ErrorCode::InvalidArgument,
                "chunks must be in [1, " + std::to_string(kMaxChunks) + "] (got " + std::to_string(opt.chunks) + ")");
  if (opt.channels == 0 || opt.channels > kMaxChannels)
    throw Error(ErrorCode::InvalidArgument, "channels must be in [1, " + std::to_string(kMaxChannels) + "] (got " +
                                                std::to_string(opt.channels) + ")");
  if (spec.count == 0) throw Error(ErrorCode::InvalidArgument, "count must be > 0 (got 0)");
  if (!isRedOp(static_cast<uint8_t>(spec.redop)) || !redOpInfo(spec.redop).collective)
    throw Error(ErrorCode::InvalidArgument, std::string("redop ") + toString(spec.redop) +
                                                " is not a collective's operator (expected " + collectiveRedOpNames() +
                                                ")");
  checkInterPhase(opt.inter);
  if (static_cast<uint8_t>(opt.protocol) > static_cast<uint8_t>(Protocol::LL128))
    throw Error(ErrorCode::InvalidArgument, "protocol must be simple, ll, ll128 or auto (got " +
                                                std::to_string(static_cast<unsigned>(opt.protocol)) + ")");
  GenContext ctx;
  ctx.spec = spec;
  ctx.opt = opt;
  ctx.nRanks = static_cast<uint32_t>(nodeOf.size());
  if (spec.op == CollOp::Broadcast && spec.root >= ctx.nRanks)
    throw Error(ErrorCode::InvalidArgument, "broadcast root " + std::to_string(spec.root) + " is not a rank (nRanks " +
                                                std::to_string(ctx.nRanks) + ")");
  std::map<uint32_t, uint32_t> dense;
  ctx.nodeOf.resize(ctx.nRanks);
  ctx.localIndex.resize(ctx.nRanks);
  for (uint32_t r = 0; r < ctx.nRanks; ++r) {
    auto [it, fresh] = dense.emplace(nodeOf[r], static_cast<uint32_t>(dense.size()));
    if (fresh) ctx.nodeRanks.emplace_back();
    ctx.nodeOf[r] = it->second;
    ctx.localIndex[r] = static_cast<uint32_t>(ctx.nodeRanks[it->second].size());
    ctx.nodeRanks[it->second].push_back(r);
  }
  for (const auto& n : ctx.nodeRanks) ctx.maxLocal = std::max(ctx.maxLocal, static_cast<uint32_t>(n.size()));
  return ctx;
}

ScheduleBuilder::ScheduleBuilder(const GenContext& ctx) : ctx_(ctx) {
  s_.nRanks = ctx.nRanks;
  s_.nodeOf = ctx.nodeOf;
  s_.lanes.resize(ctx.nRanks);
  laneIndex_.resize(ctx.nRanks);
  laneHash_.resize(ctx.nRanks);
  sent_.resize(ctx.nRanks);
  s_.info.op = toString(ctx.spec.op);
  s_.info.algo = toString(ctx.spec.algo);
  s_.info.dtype = ctx.spec.dtype;
  s_.info.redop = ctx.spec.redop;
  s_.info.count = ctx.spec.count;
  s_.info.root = ctx.spec.root;
  s_.info.chunks = ctx.opt.chunks;
  s_.info.channels = ctx.opt.channels;
}

ScheduleBuilder::ScheduleBuilder(const GenContext& ctx, uint64_t maxWeight, uint64_t laneWeight)
    : ScheduleBuilder(ctx) {
  counting_ = true;
  maxWeight_ = maxWeight;
  laneWeight_ = laneWeight;
}

uint16_t ScheduleBuilder::addBuffer(const std::string& name, DType dtype, BufferKind kind, uint64_t countPerRank) {
  if (s_.buffers.size() >= 0xFFFF) throw Error(ErrorCode::Internal, "too many buffers");
  BufferDecl d;
  d.name = name;
  d.dtype = dtype;
  d.kind = kind;
  d.count.assign(ctx_.nRanks, countPerRank);
  s_.buffers.push_back(std::move(d));
  return static_cast<uint16_t>(s_.buffers.size() - 1);
}

uint16_t ScheduleBuilder::addBuffer(const std::string& name, DType dtype, BufferKind kind,
                                    std::vector<uint64_t> countOfRank) {
  if (countOfRank.size() != ctx_.nRanks)
    throw Error(ErrorCode::Internal, "buffer '" + name + "' declared with " + std::to_string(countOfRank.size()) +
                                         " per-rank counts for " + std::to_string(ctx_.nRanks) + " ranks");
  const uint16_t id = addBuffer(name, dtype, kind, uint64_t{0});
  s_.buffers[id].count = std::move(countOfRank);
  return id;
}

uint32_t ScheduleBuilder::newFlag() { return s_.nFlags++; }

uint32_t ScheduleBuilder::lane(uint32_t rank, LaneRole role, uint32_t channel) {
  const uint64_t key = (uint64_t(static_cast<uint8_t>(role)) << 32) | channel;
  const auto& index = laneIndex_.at(rank);
  if (index.size() <= kLaneScanMax) {
    for (const auto& [k, idx] : index)
      if (k == key) return idx;
  } else {
    // Many channels: a scan per step (and per miss: generators ask for lanes of ranks that may have none) would
    // make generation quadratic in the channel count.
    const auto& hash = laneHash_[rank];
    if (const auto it = hash.find(key); it != hash.end()) return it->second;
  }
  return addLane(rank, role, key);
}

// Out of lane()'s path and never inlined into it: its locals (the new lane, the hash's nodes) would make lane()'s
// frame large, and a sanitized build clears a large frame on every call, hits included (a third of a counting
// run's time under ASan).
[[gnu::noinline]] uint32_t ScheduleBuilder::addLane(uint32_t rank, LaneRole role, uint64_t key) {
  if (counting_ && (weight_ += laneWeight_) > maxWeight_) throw StepLimitReached{};
  auto& lanes = s_.lanes[rank];
  lanes.emplace_back().role = role;
  const auto idx = static_cast<uint32_t>(lanes.size() - 1);
  auto& index = laneIndex_[rank];
  index.emplace_back(key, idx);
  if (index.size() == kLaneScanMax + 1) {
    for (const auto& [k, i] : index) laneHash_[rank].emplace(k, i);
  } else if (index.size() > kLaneScanMax + 1) {
    laneHash_[rank].emplace(key, idx);
  }
  return idx;
}

void ScheduleBuilder::reserveSteps(uint32_t rank, uint32_t lane, std::size_t steps) {
  if (counting_) return;
  auto& v = s_.lanes.at(rank).at(lane).steps;
  v.reserve(v.size() + steps);
}

Step& ScheduleBuilder::append(uint32_t rank, uint32_t lane, StepKind kind) {
  if (counting_) {
    ++counted_;
    if (++weight_ > maxWeight_) throw StepLimitReached{};
    return dropped_;  // written by the generator, never read
  }
  auto& steps = s_.lanes.at(rank).at(lane).steps;
  steps.emplace_back();
  Step& st = steps.back();
  st.kind = kind;
  st.op = ctx_.spec.redop;
  return st;
}

void ScheduleBuilder::countSignal(uint32_t rank, uint32_t flagId, uint64_t inc) {
  auto& counts = sent_.at(rank);
  if (flagId >= counts.size()) counts.resize(std::max<std::size_t>(std::size_t(flagId) + 1, s_.nFlags), 0);
  counts[flagId] += inc;
}

void ScheduleBuilder::copy(uint32_t rank, uint32_t lane, BufRef dst, BufRef src, uint64_t count) {
  Step& st = append(rank, lane, StepKind::Copy);
  st.dst = dst;
  st.a = src;
  st.count = count;
}

void ScheduleBuilder::reduce(uint32_t rank, uint32_t lane, BufRef dst, BufRef a, BufRef b, uint64_t count) {
  Step& st = append(rank, lane, StepKind::Reduce);
  st.dst = dst;
  st.a = a;
  st.b = b;
  st.count = count;
}

void ScheduleBuilder::put(uint32_t rank, uint32_t lane, BufRef dst, BufRef src, uint64_t count,
                          std::optional<uint32_t> signalFlag) {
  const bool remote = !ctx_.sameNode(rank, dst.rank);
  if (count == 0 && !remote) {
    if (signalFlag) signal(rank, lane, dst.rank, *signalFlag);
    return;
  }
  Step& st = append(rank, lane, remote ? StepKind::ProxyPut : StepKind::Put);
  st.dst = dst;
  st.a = src;
  st.count = count;
  st.flags |= ctx_.putFlags;
  if (signalFlag) {
    st.flags |= kStepSignal;
    st.flag = FlagRef{dst.rank, *signalFlag};
    st.value = 1;
    countSignal(dst.rank, *signalFlag, 1);
  }
}

void ScheduleBuilder::gemm(uint32_t rank, uint32_t lane, const GemmShape& shape, BufRef c, BufRef a, BufRef b,
                           uint8_t flags) {
  const auto key = std::make_tuple(shape.m, shape.n, shape.k, shape.lda, shape.ldb, shape.ldc);
  auto it = gemmIndex_.find(key);
  if (it == gemmIndex_.end()) {
    s_.gemms.push_back(shape);
    it = gemmIndex_.emplace(key, static_cast<uint32_t>(s_.gemms.size() - 1)).first;
  }
  Step& st = append(rank, lane, StepKind::Gemm);
  st.aux = it->second;
  st.dst = c;
  st.a = a;
  st.b = b;
  st.flags = flags;
}

void ScheduleBuilder::signal(uint32_t rank, uint32_t lane, uint32_t target, uint32_t flagId, uint64_t inc) {
  Step& st = append(rank, lane, StepKind::Signal);
  st.flag = FlagRef{target, flagId};
  st.value = inc;
  countSignal(target, flagId, inc);
}

void ScheduleBuilder::wait(uint32_t rank, uint32_t lane, uint32_t flagId, uint64_t threshold) {
  Step& st = append(rank, lane, StepKind::Wait);
  st.flag = FlagRef{rank, flagId};
  st.value = threshold;
}

void ScheduleBuilder::waitAllSent(uint32_t rank, uint32_t lane, uint32_t flagId) {
  const uint64_t n = signalsSent(rank, flagId);
  if (n > 0) wait(rank, lane, flagId, n);
}

std::vector<uint32_t> ScheduleBuilder::newFlags(std::size_t n) {
  std::vector<uint32_t> ids(n);
  for (auto& id : ids) id = newFlag();
  return ids;
}

uint16_t scratchBuffer(const GenContext& ctx) {
  if (ctx.scratch < 0)
    throw Error(ErrorCode::Internal, std::string(toString(ctx.spec.op)) + " " + toString(ctx.spec.algo) +
                                         ": the generator uses a scratch buffer but its setup declared none");
  return static_cast<uint16_t>(ctx.scratch);
}

uint32_t maxOwnedShards(const GenContext& ctx) {
  uint32_t minLocal = ctx.maxLocal;
  for (const auto& n : ctx.nodeRanks) minLocal = std::min(minLocal, static_cast<uint32_t>(n.size()));
  return (ctx.maxLocal + minLocal - 1) / minLocal;
}

uint64_t ScheduleBuilder::signalsSent(uint32_t rank, uint32_t flagId) const {
  const auto& counts = sent_.at(rank);
  return flagId < counts.size() ? counts[flagId] : 0;
}

Schedule ScheduleBuilder::finish() {
  fillCostAttributes(s_);
  return std::move(s_);
}

}  // namespace mk::detail

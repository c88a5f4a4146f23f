// mkernel — packed binary form of a Schedule (layout in pack.hpp); the cost attributes are in cost_attributes.cpp.
#include "mk/schedule/pack.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>

#include "mk/error.hpp"
#include "mk/util/format.hpp"
#include "mk/util/size.hpp"

// The image is defined as little-endian and written with memcpy of host structs.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "mkernel's packed schedule format assumes a little-endian host"
#endif

namespace mk {
namespace {

static_assert(std::is_trivially_copyable_v<PackedHeader> && std::is_trivially_copyable_v<PackedStep>);
static_assert(sizeof(PackedHeader) % 16 == 0 && sizeof(PackedBuffer) % 16 == 0 && sizeof(PackedLane) % 16 == 0 &&
                  sizeof(PackedStep) % 16 == 0 && sizeof(PackedGemm) % 16 == 0 && sizeof(PackedExtent) % 16 == 0 &&
                  sizeof(PackedAttention) % 16 == 0,
              "every packed record keeps the next one 16-byte aligned");

constexpr uint64_t alignUp16(uint64_t n) noexcept { return (n + 15) & ~uint64_t{15}; }

/// Byte offsets of every section, from the header's counts. Saturates instead of wrapping so that a
/// hostile header cannot make a huge image look small.
struct Layout {
  uint64_t buffers = 0, lanes = 0, steps = 0, gemms = 0, extents = 0, attentions = 0, counts = 0, nodeOf = 0, total = 0;
  bool overflow = false;
};

uint64_t mulSat(uint64_t a, uint64_t b, bool& overflow) noexcept {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) {
    overflow = true;
    return std::numeric_limits<uint64_t>::max();
  }
  return a * b;
}
uint64_t addSat(uint64_t a, uint64_t b, bool& overflow) noexcept {
  if (b > std::numeric_limits<uint64_t>::max() - a) {
    overflow = true;
    return std::numeric_limits<uint64_t>::max();
  }
  return a + b;
}

Layout layoutOf(uint64_t nRanks, uint64_t nBuffers, uint64_t nLanes, uint64_t nSteps, uint64_t nGemms,
                uint64_t nExtents, uint64_t nAttentions) noexcept {
  Layout l;
  bool& o = l.overflow;
  l.buffers = sizeof(PackedHeader);
  l.lanes = addSat(l.buffers, mulSat(nBuffers, sizeof(PackedBuffer), o), o);
  l.steps = addSat(l.lanes, mulSat(nLanes, sizeof(PackedLane), o), o);
  l.gemms = addSat(l.steps, mulSat(nSteps, sizeof(PackedStep), o), o);
  l.extents = addSat(l.gemms, mulSat(nGemms, sizeof(PackedGemm), o), o);
  l.attentions = addSat(l.extents, mulSat(nExtents, sizeof(PackedExtent), o), o);
  l.counts = addSat(l.attentions, mulSat(nAttentions, sizeof(PackedAttention), o), o);
  l.nodeOf = addSat(l.counts, mulSat(mulSat(nBuffers, nRanks, o), sizeof(uint64_t), o), o);
  l.total = alignUp16(addSat(l.nodeOf, mulSat(nRanks, sizeof(uint32_t), o), o));
  return l;
}

PackedStep packStep(const Step& st) noexcept {
  PackedStep p{};
  p.kind = static_cast<uint8_t>(st.kind);
  p.op = static_cast<uint8_t>(st.op);
  p.link = static_cast<uint8_t>(st.link);
  p.flags = st.flags;
  p.aux = st.aux;
  p.count = st.count;
  p.dst = st.dst;
  p.a = st.a;
  p.b = st.b;
  p.flag = st.flag;
  p.value = st.value;
  p.extent = st.extent;
  return p;
}

/// Shared by pack() and packRank(): `onlyRank` < 0 packs every rank's lanes.
std::vector<uint8_t> packImpl(const Schedule& s, int64_t onlyRank) {
  if (s.nodeOf.size() != s.nRanks || s.lanes.size() != s.nRanks)
    throw Error(ErrorCode::InvalidArgument, "cannot pack: nodeOf has " + std::to_string(s.nodeOf.size()) +
                                                " entries and lanes " + std::to_string(s.lanes.size()) +
                                                ", expected nRanks = " + std::to_string(s.nRanks));
  if (s.buffers.size() > 0xFFFF)
    throw Error(ErrorCode::InvalidArgument,
                "cannot pack: " + std::to_string(s.buffers.size()) + " buffers (at most 65535)");
  for (std::size_t b = 0; b < s.buffers.size(); ++b)
    if (s.buffers[b].count.size() != s.nRanks)
      throw Error(ErrorCode::InvalidArgument, "cannot pack: buffer '" + s.buffers[b].name + "' has " +
                                                  std::to_string(s.buffers[b].count.size()) +
                                                  " per-rank counts, expected nRanks = " + std::to_string(s.nRanks));
  if (s.gemms.size() > std::numeric_limits<uint32_t>::max())
    throw Error(ErrorCode::InvalidArgument, "cannot pack: too many gemm shapes");
  if (s.extents.size() >= kNoExtent) throw Error(ErrorCode::InvalidArgument, "cannot pack: too many extents");
  if (s.attentions.size() > std::numeric_limits<uint32_t>::max())
    throw Error(ErrorCode::InvalidArgument, "cannot pack: too many attention shapes");

  const uint32_t firstRank = onlyRank < 0 ? 0 : static_cast<uint32_t>(onlyRank);
  const uint32_t endRank = onlyRank < 0 ? s.nRanks : firstRank + 1;
  uint64_t nLanes = 0, nSteps = 0;
  for (uint32_t r = firstRank; r < endRank; ++r) {
    if (s.lanes[r].size() > 0xFFFF)
      throw Error(ErrorCode::InvalidArgument, "cannot pack: rank " + std::to_string(r) + " has " +
                                                  std::to_string(s.lanes[r].size()) + " lanes (at most 65535)");
    nLanes += s.lanes[r].size();
    for (std::size_t l = 0; l < s.lanes[r].size(); ++l) {
      const auto n = s.lanes[r][l].steps.size();
      if (n > std::numeric_limits<uint32_t>::max())
        throw Error(ErrorCode::InvalidArgument, "cannot pack: rank " + std::to_string(r) + " lane " +
                                                    std::to_string(l) + " has more than 2^32-1 steps");
      nSteps += n;
    }
  }
  if (nLanes > std::numeric_limits<uint32_t>::max())
    throw Error(ErrorCode::InvalidArgument, "cannot pack: too many lanes");

  const Layout lay =
      layoutOf(s.nRanks, s.buffers.size(), nLanes, nSteps, s.gemms.size(), s.extents.size(), s.attentions.size());
  // Zero-filled: reserved fields and padding are defined bytes, so images compare equal byte for byte.
  std::vector<uint8_t> image(lay.total, 0);
  uint8_t* base = image.data();

  PackedHeader h{};
  h.magic = kPackMagic;
  h.version = kPackVersion;
  h.nRanks = s.nRanks;
  h.nFlags = s.nFlags;
  h.nBarriers = s.nBarriers;
  h.nBuffers = static_cast<uint32_t>(s.buffers.size());
  h.nLanes = static_cast<uint32_t>(nLanes);
  h.nGemms = static_cast<uint32_t>(s.gemms.size());
  h.nSteps = nSteps;
  h.totalBytes = lay.total;
  h.nExtents = static_cast<uint32_t>(s.extents.size());
  h.nAttentions = static_cast<uint32_t>(s.attentions.size());
  std::memcpy(base, &h, sizeof h);

  for (std::size_t b = 0; b < s.buffers.size(); ++b) {
    PackedBuffer pb{};
    pb.dtype = static_cast<uint8_t>(s.buffers[b].dtype);
    pb.kind = static_cast<uint8_t>(s.buffers[b].kind);
    std::memcpy(base + lay.buffers + b * sizeof(PackedBuffer), &pb, sizeof pb);
  }

  uint64_t laneSlot = 0, stepSlot = 0;
  for (uint32_t r = firstRank; r < endRank; ++r) {
    for (std::size_t l = 0; l < s.lanes[r].size(); ++l) {
      const Lane& lane = s.lanes[r][l];
      PackedLane pl{};
      pl.rank = r;
      pl.role = static_cast<uint8_t>(lane.role);
      pl.laneIndex = static_cast<uint16_t>(l);
      pl.ctas = lane.ctas;
      pl.nSteps = static_cast<uint32_t>(lane.steps.size());
      pl.firstStep = stepSlot;
      std::memcpy(base + lay.lanes + laneSlot * sizeof(PackedLane), &pl, sizeof pl);
      ++laneSlot;
      uint8_t* out = base + lay.steps + stepSlot * sizeof(PackedStep);
      for (const Step& st : lane.steps) {
        const PackedStep ps = packStep(st);
        std::memcpy(out, &ps, sizeof ps);
        out += sizeof ps;
      }
      stepSlot += lane.steps.size();
    }
  }

  for (std::size_t g = 0; g < s.gemms.size(); ++g) {
    const GemmShape& gs = s.gemms[g];
    PackedGemm pg{};
    pg.m = gs.m;
    pg.n = gs.n;
    pg.k = gs.k;
    pg.lda = gs.lda;
    pg.ldb = gs.ldb;
    pg.ldc = gs.ldc;
    pg.extent = gs.extent;
    std::memcpy(base + lay.gemms + g * sizeof(PackedGemm), &pg, sizeof pg);
  }
  for (std::size_t e = 0; e < s.extents.size(); ++e) {
    const ExtentDecl& d = s.extents[e];
    PackedExtent pe{};
    pe.bound = d.bound;
    pe.expected = d.expected;
    pe.sourceBuffer = d.sourceBuffer;
    pe.sourceElement = d.sourced() ? d.sourceElement : 0;
    std::memcpy(base + lay.extents + e * sizeof(PackedExtent), &pe, sizeof pe);
  }
  for (std::size_t i = 0; i < s.attentions.size(); ++i) {
    const AttentionShape& a = s.attentions[i];
    const PackedAttention pa{a.batch,
                             a.qHeads,
                             a.kvHeads,
                             a.headDim,
                             a.sq,
                             a.skv,
                             a.ldq,
                             a.ldkv,
                             a.ldo,
                             a.scale,
                             a.causal ? uint8_t{1} : uint8_t{0},
                             0,
                             0,
                             0,
                             a.vOffset,
                             a.qPos,
                             a.kvPos,
                             a.doOffset,
                             a.rowsAt,
                             a.dqAt};
    std::memcpy(base + lay.attentions + i * sizeof(PackedAttention), &pa, sizeof pa);
  }
  for (std::size_t b = 0; b < s.buffers.size(); ++b)
    std::memcpy(base + lay.counts + b * s.nRanks * sizeof(uint64_t), s.buffers[b].count.data(),
                s.nRanks * sizeof(uint64_t));
  if (s.nRanks > 0) std::memcpy(base + lay.nodeOf, s.nodeOf.data(), s.nRanks * sizeof(uint32_t));
  return image;
}

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::ParseError, "packed schedule: " + what); }

}  // namespace

std::vector<uint8_t> pack(const Schedule& s) { return packImpl(s, -1); }

std::vector<uint8_t> packRank(const Schedule& s, uint32_t rank) {
  if (rank >= s.nRanks)
    throw Error(ErrorCode::InvalidArgument,
                "packRank: rank " + std::to_string(rank) + " is not a rank (nRanks " + std::to_string(s.nRanks) + ")");
  return packImpl(s, rank);
}

Schedule unpack(const uint8_t* data, std::size_t size) {
  if (data == nullptr || size < sizeof(PackedHeader))
    bad("image of " + std::to_string(size) + " bytes is shorter than its " + std::to_string(sizeof(PackedHeader)) +
        "-byte header (truncated)");
  PackedHeader h;
  std::memcpy(&h, data, sizeof h);
  if (h.magic != kPackMagic) {
    bad("bad magic " + strprintf("0x%08X", h.magic) + " (expected 0x43534B4D, \"MKSC\"): not a packed schedule image");
  }
  if (h.version != kPackVersion)
    bad("unsupported version " + std::to_string(h.version) + " (this build reads version " +
        std::to_string(kPackVersion) + (h.version < kPackVersion ? "; pack the schedule again" : "") + ")");
  const Layout lay = layoutOf(h.nRanks, h.nBuffers, h.nLanes, h.nSteps, h.nGemms, h.nExtents, h.nAttentions);
  if (lay.overflow) bad("header counts overflow the address space (corrupt header)");
  if (h.totalBytes != lay.total)
    bad("header says " + std::to_string(h.totalBytes) + " bytes but its counts imply " + std::to_string(lay.total));
  if (size < lay.total)
    bad("image has " + std::to_string(size) + " bytes, expected " + std::to_string(lay.total) + " (truncated)");
  if (h.nBuffers > 0xFFFF) bad("nBuffers " + std::to_string(h.nBuffers) + " exceeds 65535");

  Schedule s;
  s.nRanks = h.nRanks;
  s.nFlags = h.nFlags;
  s.nBarriers = h.nBarriers;
  s.nodeOf.resize(h.nRanks);
  if (h.nRanks > 0) std::memcpy(s.nodeOf.data(), data + lay.nodeOf, h.nRanks * sizeof(uint32_t));

  s.buffers.resize(h.nBuffers);
  for (uint32_t b = 0; b < h.nBuffers; ++b) {
    PackedBuffer pb;
    std::memcpy(&pb, data + lay.buffers + uint64_t{b} * sizeof(PackedBuffer), sizeof pb);
    if (!isDType(pb.dtype)) bad("buffer " + std::to_string(b) + ": unknown dtype " + std::to_string(pb.dtype));
    if (pb.kind > static_cast<uint8_t>(BufferKind::InOut))
      bad("buffer " + std::to_string(b) + ": unknown buffer kind " + std::to_string(pb.kind));
    BufferDecl& d = s.buffers[b];
    d.name = "buf" + std::to_string(b);
    d.dtype = static_cast<DType>(pb.dtype);
    d.kind = static_cast<BufferKind>(pb.kind);
    d.count.resize(h.nRanks);
    if (h.nRanks > 0)
      std::memcpy(d.count.data(), data + lay.counts + uint64_t{b} * h.nRanks * sizeof(uint64_t),
                  h.nRanks * sizeof(uint64_t));
    for (uint32_t r = 0; r < h.nRanks; ++r)
      if (d.count[r] > kMaxElements)
        bad("buffer " + std::to_string(b) + " rank " + std::to_string(r) + ": count " + std::to_string(d.count[r]) +
            " exceeds " + std::to_string(kMaxElements) + " elements");
  }

  s.gemms.resize(h.nGemms);
  for (uint32_t g = 0; g < h.nGemms; ++g) {
    PackedGemm pg;
    std::memcpy(&pg, data + lay.gemms + uint64_t{g} * sizeof(PackedGemm), sizeof pg);
    s.gemms[g] = GemmShape{pg.m, pg.n, pg.k, pg.lda, pg.ldb, pg.ldc, pg.extent};
    if (pg.extent != kNoExtent && pg.extent >= h.nExtents)
      bad("gemm " + std::to_string(g) + ": extent " + std::to_string(pg.extent) + " out of range (nExtents " +
          std::to_string(h.nExtents) + ")");
  }
  s.extents.resize(h.nExtents);
  for (uint32_t e = 0; e < h.nExtents; ++e) {
    PackedExtent pe;
    std::memcpy(&pe, data + lay.extents + uint64_t{e} * sizeof(PackedExtent), sizeof pe);
    if (pe.bound == 0 || pe.bound > kMaxElements || !(pe.expected >= 0 && pe.expected <= static_cast<double>(pe.bound)))
      bad("extent " + std::to_string(e) + ": bound " + std::to_string(pe.bound) + " or expected " +
          formatNumber(pe.expected) + " out of range (bound in [1, 2^50], expected in [0, bound])");
    if (pe.sourceBuffer != kNoSourceBuffer && (pe.sourceBuffer >= h.nBuffers || pe.sourceElement > kMaxElements))
      bad("extent " + std::to_string(e) + ": source buffer " + std::to_string(pe.sourceBuffer) + " element " +
          std::to_string(pe.sourceElement) + " out of range (nBuffers " + std::to_string(h.nBuffers) +
          ", elements at most 2^50)");
    s.extents[e] = ExtentDecl{"extent" + std::to_string(e), pe.bound, pe.expected};
    if (pe.sourceBuffer != kNoSourceBuffer) {
      s.extents[e].sourceBuffer = pe.sourceBuffer;
      s.extents[e].sourceElement = pe.sourceElement;
    }
  }

  s.attentions.resize(h.nAttentions);
  for (uint32_t i = 0; i < h.nAttentions; ++i) {
    PackedAttention pa;
    std::memcpy(&pa, data + lay.attentions + uint64_t{i} * sizeof(PackedAttention), sizeof pa);
    if (pa.causal > 1) bad("attention " + std::to_string(i) + ": causal " + std::to_string(pa.causal) + " (0 or 1)");
    s.attentions[i] = AttentionShape{pa.batch, pa.qHeads, pa.kvHeads,  pa.headDim,     pa.sq,    pa.skv,
                                     pa.ldq,   pa.ldkv,   pa.ldo,      pa.causal == 1, pa.scale, pa.vOffset,
                                     pa.qPos,  pa.kvPos,  pa.doOffset, pa.rowsAt,      pa.dqAt};
  }

  s.lanes.resize(h.nRanks);
  uint64_t expectFirst = 0;
  int64_t prevRank = -1;
  for (uint32_t li = 0; li < h.nLanes; ++li) {
    PackedLane pl;
    std::memcpy(&pl, data + lay.lanes + uint64_t{li} * sizeof(PackedLane), sizeof pl);
    const std::string where = "lane record " + std::to_string(li);
    if (pl.rank >= h.nRanks)
      bad(where + ": rank " + std::to_string(pl.rank) + " out of range (nRanks " + std::to_string(h.nRanks) + ")");
    if (static_cast<int64_t>(pl.rank) < prevRank)
      bad(where + ": rank " + std::to_string(pl.rank) + " after rank " + std::to_string(prevRank) +
          " (lanes must be rank-major)");
    prevRank = pl.rank;
    if (pl.laneIndex != s.lanes[pl.rank].size())
      bad(where + ": laneIndex " + std::to_string(pl.laneIndex) + ", expected " +
          std::to_string(s.lanes[pl.rank].size()) + " (lanes of a rank must be consecutive)");
    if (pl.role > static_cast<uint8_t>(LaneRole::InterRecv))
      bad(where + ": unknown lane role " + std::to_string(pl.role));
    if (pl.firstStep > h.nSteps || pl.nSteps > h.nSteps - pl.firstStep)
      bad(where + ": steps [" + std::to_string(pl.firstStep) + ", +" + std::to_string(pl.nSteps) + ") exceed nSteps " +
          std::to_string(h.nSteps));
    if (pl.firstStep != expectFirst)
      bad(where + ": firstStep " + std::to_string(pl.firstStep) + ", expected " + std::to_string(expectFirst) +
          " (each lane's steps follow the previous lane's)");
    expectFirst += pl.nSteps;

    Lane lane;
    lane.role = static_cast<LaneRole>(pl.role);
    lane.ctas = pl.ctas;
    lane.steps.resize(pl.nSteps);
    const uint8_t* in = data + lay.steps + pl.firstStep * sizeof(PackedStep);
    for (uint32_t i = 0; i < pl.nSteps; ++i, in += sizeof(PackedStep)) {
      PackedStep ps;
      std::memcpy(&ps, in, sizeof ps);
      auto fail = [&](const std::string& what) {
        bad("rank " + std::to_string(pl.rank) + " lane " + std::to_string(pl.laneIndex) + " step " + std::to_string(i) +
            ": " + what);
      };
      if (!isStepKind(ps.kind)) fail("unknown step kind " + std::to_string(ps.kind));
      if (!isRedOp(ps.op)) fail("unknown reduction op " + std::to_string(ps.op));
      if (ps.link > static_cast<uint8_t>(LinkClass::Network)) fail("unknown link class " + std::to_string(ps.link));
      const auto kind = static_cast<StepKind>(ps.kind);
      auto checkRef = [&](const BufRef& r, const char* name) {
        if (r.buffer >= h.nBuffers)
          fail(std::string(name) + " buffer id " + std::to_string(r.buffer) + " out of range (nBuffers " +
               std::to_string(h.nBuffers) + ")");
        if (r.rank >= h.nRanks)
          fail(std::string(name) + " rank " + std::to_string(r.rank) + " out of range (nRanks " +
               std::to_string(h.nRanks) + ")");
      };
      if (const char* problem = protocolFlagProblem(kind, ps.flags)) fail(problem);
      if (ps.count > kMaxElements || ps.dst.offset > kMaxElements || ps.a.offset > kMaxElements ||
          ps.b.offset > kMaxElements)
        fail("a count or offset exceeds " + std::to_string(kMaxElements) + " elements");
      const StepKindInfo& info = kindInfo(kind);
      if (info.fields & kFieldDst) checkRef(ps.dst, "dst");
      if (info.fields & kFieldA) checkRef(ps.a, "a");
      if (info.fields & kFieldB) checkRef(ps.b, "b");
      const uint64_t gemmEnd = uint64_t{ps.aux} + ((info.fields & kFieldCount) ? ps.count : 1);
      if (info.extent == StepExtent::Tile && gemmEnd > h.nGemms)
        fail("gemm index " + std::to_string(gemmEnd - 1) + " out of range (nGemms " + std::to_string(h.nGemms) + ")");
      if (info.extent == StepExtent::Attention && ps.aux >= h.nAttentions)
        fail("attention index " + std::to_string(ps.aux) + " out of range (nAttentions " +
             std::to_string(h.nAttentions) + ")");
      const bool hasFlag = (info.fields & kFieldFlag) || incrementsFlag(kind, ps.flags);
      if (hasFlag && ps.flag.rank >= h.nRanks)
        fail("flag rank " + std::to_string(ps.flag.rank) + " out of range (nRanks " + std::to_string(h.nRanks) + ")");
      Step& st = lane.steps[i];
      st.kind = kind;
      st.op = static_cast<RedOp>(ps.op);
      st.link = static_cast<LinkClass>(ps.link);
      st.flags = ps.flags;
      st.aux = ps.aux;
      st.count = ps.count;
      st.dst = ps.dst;
      st.a = ps.a;
      st.b = ps.b;
      st.flag = ps.flag;
      st.value = ps.value;
      if (ps.extent != kNoExtent && (ps.extent >= h.nExtents || !(info.fields & kFieldExtent)))
        fail("extent " + std::to_string(ps.extent) +
             (ps.extent >= h.nExtents ? " out of range (nExtents " + std::to_string(h.nExtents) + ")"
                                      : std::string(" on a step kind that takes none")));
      st.extent = ps.extent;
    }
    s.lanes[pl.rank].push_back(std::move(lane));
  }
  if (expectFirst != h.nSteps)
    bad("lanes cover " + std::to_string(expectFirst) + " steps but the header says nSteps " + std::to_string(h.nSteps));
  fillCostAttributes(s);
  return s;
}

}  // namespace mk

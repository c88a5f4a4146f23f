// mkernel — the lowering's checks and record of a GroupedGemm step (grouped_gemm_step.hpp).
#include "lowering/grouped_gemm_step.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "mk/device/grouped_gemm_device.hpp"
#include "mk/error.hpp"

namespace mk::runtime {
namespace {

std::string str(uint64_t v) { return std::to_string(v); }

bool sameShape(const GemmShape& x, const GemmShape& y) {
  return x.m == y.m && x.n == y.n && x.k == y.k && x.lda == y.lda && x.ldb == y.ldb && x.ldc == y.ldc;
}

}  // namespace

uint64_t groupedGemmTiles(const Schedule& s, const Step& st) {
  if (st.aux >= s.gemms.size() || st.count == 0 || st.count > s.gemms.size() - st.aux) return 1;
  const GemmShape& g = s.gemms[st.aux];
  return std::max<uint64_t>(1, st.count * ((uint64_t{g.m} + 127) / 128) * ((uint64_t{g.n} + 127) / 128));
}

GroupedGemmStepLowering lowerGroupedGemmStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step,
                                             uint32_t ctas) {
  const Step& st = s.lanes[rank][lane].steps[step];
  auto fail = [&](ErrorCode code, const std::string& msg) {
    throw Error(code, describeStep(s, rank, lane, step) + ": " + msg);
  };
  const uint64_t groups = st.count;
  if (st.aux >= s.gemms.size() || groups > s.gemms.size() - st.aux)
    fail(ErrorCode::InvalidSchedule, "gemms [" + str(st.aux) + ", " + str(uint64_t{st.aux} + groups) +
                                         ") fall outside the schedule's " + str(s.gemms.size()) + " gemm shapes");
  if (groups < 1 || groups > device::kGroupedGemmMaxGroups)
    fail(ErrorCode::Unsupported, "count " + str(groups) + ": the grouped GEMM engine runs 1 to " +
                                     str(device::kGroupedGemmMaxGroups) + " groups in one step");
  const GemmShape& g = s.gemms[st.aux];
  for (uint64_t h = 1; h < groups; ++h)
    if (!sameShape(s.gemms[st.aux + h], g))
      fail(ErrorCode::Unsupported, "gemms[" + str(st.aux + h) + "] differs from gemms[" + str(st.aux) +
                                       "] in m, n, k or a leading dimension: the grouped GEMM engine runs groups "
                                       "of one shape (split the step)");
  const std::string shape = "gemms[" + str(st.aux) + "] (m " + str(g.m) + ", n " + str(g.n) + ", k " + str(g.k) + ")";
  const bool colB = (st.flags & kStepBColMajor) != 0;
  const bool swiglu = (st.flags & kStepSwiGLU) != 0;
  if (st.flags & kStepAccumulate)
    fail(ErrorCode::Unsupported, "accumulation (C += A x B): the grouped GEMM engine writes C (C = A x B)");
  if (g.m == 0 || g.n == 0 || g.k == 0) fail(ErrorCode::Unsupported, shape + ": the engine needs m, n and k >= 1");
  if (swiglu && g.n % 2 != 0)
    fail(ErrorCode::Unsupported, shape + ": SwiGLU needs an even n (interleaved gate / up column pairs)");
  const uint32_t cWidth = swiglu ? g.n / 2 : g.n;
  const uint32_t needLdb = colB ? g.k : g.n;
  struct Ld {
    uint32_t ld, least;
    const char* name;
  };
  for (const auto& [ld, least, name] : {Ld{g.lda, g.k, "lda"}, Ld{g.ldb, needLdb, "ldb"}, Ld{g.ldc, cWidth, "ldc"}}) {
    if (ld < least)
      fail(ErrorCode::InvalidSchedule, shape + ": " + name + " " + str(ld) + " is below its minimum " + str(least));
    if (ld % 8 != 0)
      fail(ErrorCode::Unsupported,
           shape + ": " + name + " " + str(ld) + " is not a multiple of 8 elements (TMA needs 16-byte aligned rows)");
  }
  for (const auto& [ref, name] :
       {std::pair<const BufRef*, const char*>{&st.dst, "C (dst)"}, {&st.a, "A (a)"}, {&st.b, "B (b)"}}) {
    if (ref->rank != rank)
      fail(ErrorCode::Unsupported, std::string(name) + " lives on rank " + str(ref->rank) +
                                       ": a GroupedGemm step reads and writes only its own rank's memory");
  }
  const DType at = s.buffers[st.a.buffer].dtype, bt = s.buffers[st.b.buffer].dtype;
  const DType ct = s.buffers[st.dst.buffer].dtype;
  if (at != DType::BFloat16 || bt != DType::BFloat16)
    fail(ErrorCode::Unsupported,
         std::string("A and B must be bfloat16 buffers (got A ") + toString(at) + ", B " + toString(bt) + ")");
  if (ct != DType::BFloat16 && ct != DType::Float32)
    fail(ErrorCode::Unsupported, std::string("C must be a bfloat16 or float32 buffer (got ") + toString(ct) + ")");
  struct Start {
    const BufRef* ref;
    uint64_t elementBytes;
    const char* name;
  };
  for (const auto& [ref, es, name] :
       {Start{&st.dst, dtypeSize(ct), "C (dst)"}, Start{&st.a, 2, "A (a)"}, Start{&st.b, 2, "B (b)"}})
    if (ref->offset * es % 16 != 0)
      fail(ErrorCode::Unsupported, std::string(name) + " starts " + str(ref->offset * es) +
                                       " bytes into its buffer, not a multiple of 16 (TMA needs 16-byte alignment)");
  const uint64_t rows = groups * g.m;
  const uint64_t tiles = groups * ((uint64_t{g.m} + 127) / 128) * ((uint64_t{g.n} + 255) / 256);
  if (rows >= (uint64_t{1} << 31) || tiles >= (uint64_t{1} << 31))
    fail(ErrorCode::Unsupported, shape + " x " + str(groups) + " groups: the engine's rows and tiles are 32-bit");

  GroupedGemmStepLowering out;
  // The row counts: every group's runtime extent, consecutive int32 elements of one buffer (a route's or a notify's
  // counts), or none at all.
  uint64_t withExtent = 0;
  for (uint64_t h = 0; h < groups; ++h) withExtent += s.gemms[st.aux + h].extent != kNoExtent ? 1 : 0;
  if (withExtent != 0 && withExtent != groups)
    fail(ErrorCode::Unsupported, str(withExtent) + " of the step's " + str(groups) +
                                     " groups have runtime rows: the engine reads either a count per group or none");
  if (withExtent == groups) {
    const uint32_t e0 = s.gemms[st.aux].extent;
    for (uint64_t h = 0; h < groups; ++h) {
      const uint32_t e = s.gemms[st.aux + h].extent;
      const std::string which = "gemms[" + str(st.aux + h) + "]'s extent";
      if (e >= s.extents.size())
        fail(ErrorCode::InvalidSchedule,
             which + " " + str(e) + " is outside the schedule's " + str(s.extents.size()) + " extents");
      const ExtentDecl& d = s.extents[e];
      const ExtentDecl& d0 = s.extents[e0];
      if (!d.sourced())
        fail(ErrorCode::Unsupported, which + " '" + d.name +
                                         "' is given by the caller: the grouped GEMM engine reads its groups' rows "
                                         "from an int32 buffer of the schedule (a sourced extent)");
      if (d.sourceBuffer >= s.buffers.size() || s.buffers[d.sourceBuffer].dtype != DType::Int32)
        fail(ErrorCode::InvalidSchedule, which + " '" + d.name + "' is read from a buffer that is not int32");
      if (d.sourceBuffer != d0.sourceBuffer || d.sourceElement != d0.sourceElement + h)
        fail(ErrorCode::Unsupported, which + " '" + d.name + "' is not element " + str(d0.sourceElement + h) +
                                         " of buffer '" + s.buffers[d0.sourceBuffer].name +
                                         "': the engine reads the groups' rows as one int32 array");
      if (d.bound != g.m)
        fail(ErrorCode::Unsupported, which + " '" + d.name + "' has bound " + str(d.bound) + ", not the groups' m " +
                                         str(g.m) + " (each group's block holds m rows)");
    }
    const ExtentDecl& d0 = s.extents[e0];
    if (d0.sourceElement + groups > s.buffers[d0.sourceBuffer].count[rank])
      fail(ErrorCode::InvalidSchedule, "the groups' counts [" + str(d0.sourceElement) + ", " +
                                           str(d0.sourceElement + groups) + ") fall outside buffer '" +
                                           s.buffers[d0.sourceBuffer].name + "' of rank " + str(rank));
    out.counted = true;
    out.counts = bufRef(rank, d0.sourceBuffer, d0.sourceElement);
  }
  const uint64_t bBlock = uint64_t{colB ? g.n : g.k} * g.ldb;  // forEachGemm's stride between groups' B
  out.aSpan = (rows - 1) * g.lda + g.k;
  out.cSpan = (rows - 1) * g.ldc + cWidth;
  out.bSpan = (groups - 1) * bBlock + (colB ? (uint64_t{g.n} - 1) * g.ldb + g.k : (uint64_t{g.k} - 1) * g.ldb + g.n);
  device::LoweredGroupedGemm& r = out.record;
  r.groups = static_cast<uint32_t>(groups);
  r.rows = g.m;
  r.n = g.n;
  r.k = g.k;
  r.lda = g.lda;
  r.ldb = g.ldb;
  r.ldc = g.ldc;
  r.flags = (colB ? device::kLggBColMajor : 0u) | (swiglu ? device::kLggSwiglu : 0u);
  r.ctas = static_cast<uint32_t>(std::min<uint64_t>(std::max<uint32_t>(ctas, 1), tiles));
  r.lane = static_cast<uint16_t>(lane);
  r.outDType = static_cast<uint8_t>(ct);
  r.step = step;
  r.bStride = bBlock;
  r.counts = device::kStaticGroupCounts;
  return out;
}

}  // namespace mk::runtime

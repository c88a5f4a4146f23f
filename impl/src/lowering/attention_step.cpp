// mkernel — the lowering's checks and record of an Attention step (attention_step.hpp).
#include "lowering/attention_step.hpp"

#include <algorithm>
#include <string>

#include "mk/attention_params.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

uint64_t attentionUnits(const AttentionShape& sh) {
  return uint64_t{sh.batch} * sh.qHeads * ((uint64_t{sh.sq} + 127) / 128);
}

AttentionStepLowering lowerAttentionStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step,
                                         uint32_t ctas) {
  const Step& st = s.lanes[rank][lane].steps[step];
  auto fail = [&](ErrorCode code, const std::string& msg) {
    throw Error(code, describeStep(s, rank, lane, step) + ": " + msg);
  };
  if (st.aux >= s.attentions.size())
    fail(ErrorCode::InvalidSchedule, "attention index " + std::to_string(st.aux) + " is outside the schedule's " +
                                         std::to_string(s.attentions.size()) + " attention shapes");
  const AttentionShape& sh = s.attentions[st.aux];
  const DType qt = s.buffers[st.a.buffer].dtype, kvt = s.buffers[st.b.buffer].dtype;
  const std::string why = attentionForwardProblem(sh, qt);
  if (!why.empty()) fail(ErrorCode::Unsupported, "attentions[" + std::to_string(st.aux) + "]: " + why);
  if (kvt != qt)
    fail(ErrorCode::Unsupported, std::string("K / V (b) is ") + toString(kvt) + ", Q (a) " + toString(qt) +
                                     ": the GPU attention engine reads both as bf16");
  if (s.buffers[st.dst.buffer].dtype != DType::Float32)
    fail(ErrorCode::Unsupported, std::string("the output (dst) must be a float32 buffer (got ") +
                                     toString(s.buffers[st.dst.buffer].dtype) + ")");
  for (const auto& [ref, name] :
       {std::pair<const BufRef*, const char*>{&st.dst, "out (dst)"}, {&st.a, "Q (a)"}, {&st.b, "K / V (b)"}})
    if (ref->rank != rank)
      fail(ErrorCode::Unsupported, std::string(name) + " lives on rank " + std::to_string(ref->rank) +
                                       ": an Attention step reads and writes only its own rank's memory");
  for (const auto& [ref, name] : {std::pair<const BufRef*, const char*>{&st.a, "Q (a)"}, {&st.b, "K / V (b)"}})
    if (ref->offset % 8 != 0)
      fail(ErrorCode::Unsupported, std::string(name) + " starts " + std::to_string(ref->offset) +
                                       " elements into its buffer, not a multiple of 8 (TMA needs 16-byte alignment)");
  AttentionStepLowering out;
  out.spans = attentionElements(sh);
  device::LoweredAttention& r = out.record;
  r.batch = sh.batch;
  r.qHeads = sh.qHeads;
  r.kvHeads = sh.kvHeads;
  r.headDim = sh.headDim;
  r.sq = sh.sq;
  r.skv = sh.skv;
  r.ldq = sh.ldq;
  r.ldkv = sh.ldkv;
  r.ldo = sh.ldo;
  r.causal = sh.causal ? 1u : 0u;
  r.scale = sh.scale;
  r.units = static_cast<uint32_t>(attentionUnits(sh));  // < 2^31: attentionForwardProblem
  r.ctas = std::min<uint32_t>(std::max<uint32_t>(ctas, 1), r.units);
  r.lane = static_cast<uint16_t>(lane);
  r.step = step;
  r.causalDelta = static_cast<int64_t>(sh.qPos) - static_cast<int64_t>(sh.kvPos);
  r.vOffset = sh.vOffset;
  return out;
}

}  // namespace mk::runtime

// mkernel — mk-bench ring-attention's records in mk-validate's fused table (validate.hpp, "ring attention"): the
// record turned back into the schedule that ran, its lanes holding the SMs they held.
#include <algorithm>
#include <string>

#include "mk/error.hpp"
#include "mk/io/json.hpp"
#include "mk/validation/validate.hpp"
#include "record_fields.hpp"

namespace mk {

using record_fields::bad;
using record_fields::countField;
using record_fields::field;

bool isRingAttentionRecord(const MeasurementRecord& r) noexcept {
  return r.impl == "mkernel" && r.op == "ring-attention";
}

RingAttentionRecordRequest ringAttentionRecordRequest(const MeasurementRecord& r, const std::string& where) {
  if (!isRingAttentionRecord(r)) bad(where, "op '" + r.op + "' of impl '" + r.impl + "' is not our ring-attention");
  RingAttentionRecordRequest q;
  q.spec.dtype = record_fields::dtypeOf(r, where);
  q.nRanks = record_fields::ranksOf(r, where);
  q.spec.batch = *countField(r, "batch", where, true, 1);
  const uint32_t perRank = *countField(r, "seq_per_rank", where, true, 1);
  q.spec.seq = uint64_t{perRank} * q.nRanks;
  q.spec.qHeads = *countField(r, "q_heads", where, true, 1);
  q.spec.kvHeads = *countField(r, "kv_heads", where, true, 1);
  q.spec.headDim = *countField(r, "head_dim", where, true, 1);
  const auto causal = field(r, "causal");
  if (!causal) bad(where, "missing field 'causal' (true or false: whether later keys were masked; mk-bench writes it)");
  q.spec.causal = json_get::boolean(*causal, where + ": field 'causal'");
  q.ctas = *countField(r, "ctas", where, true, 1);
  q.computeCtas = *countField(r, "compute_ctas", where, true, 1);
  q.commCtas = *countField(r, "comm_ctas", where, true, 1);
  if (uint64_t{q.computeCtas} + q.commCtas > q.ctas)
    bad(where, "field 'ctas' " + std::to_string(q.ctas) + " is less than compute_ctas " +
                   std::to_string(q.computeCtas) + " + comm_ctas " + std::to_string(q.commCtas) +
                   " (the lanes' CTAs are some of the rank's)");
  q.spec.computeCtas = q.computeCtas;
  const record_fields::RecordPlacement placed = record_fields::placementOf(r, where, q.nRanks);
  q.nodes = placed.nodes;
  q.sharedGpu = placed.sharedGpu;
  q.transport = placed.transport;
  try {
    validateRingAttentionSpec(q.spec, q.nRanks);
  } catch (const Error& e) {
    bad(where,
        "fields batch, seq_per_rank, q_heads, kv_heads, head_dim, causal (the shape that ran; the sequence is "
        "ranks x seq_per_rank): " +
            e.message());
  }
  return q;
}

Schedule ringAttentionRecordSchedule(const RingAttentionRecordRequest& q, const std::vector<uint32_t>& nodeOf) {
  Schedule s = generateRingAttention(q.spec, nodeOf);
  for (std::vector<Lane>& lanes : s.lanes)
    for (Lane& lane : lanes) lane.ctas = lane.role == LaneRole::Compute ? q.computeCtas : q.commCtas;
  return s;
}

Profile heldSmsProfile(const Profile& p, uint32_t heldSms) {
  if (p.sms == 0 || heldSms == p.sms) return p;
  if (heldSms == 0 || heldSms > p.sms)
    throw Error(ErrorCode::InvalidArgument, "the rank's lanes hold " + std::to_string(heldSms) +
                                                " CTAs, but the profile's GPU has " + std::to_string(p.sms) +
                                                " SMs: give a profile of the GPU that ran it");
  // Rule 2b gives a lane sms x its CTAs / the rank's CTAs of the tensor rate's sms-th parts: on this GPU of the
  // rank's own SMs, exactly its own CTAs' share of the whole GPU's rate.
  Profile out = p;
  const double share = static_cast<double>(heldSms) / p.sms;
  out.sms = heldSms;
  out.gemmTflops *= share;
  out.attentionTflops *= share;
  return out;
}

std::string describeRingAttention(const RingAttentionSpec& spec) {
  return (spec.batch > 1 ? "B" + std::to_string(spec.batch) + " " : std::string()) + "S " + std::to_string(spec.seq) +
         " h " + std::to_string(spec.qHeads) + "/" + std::to_string(spec.kvHeads) + " D" +
         std::to_string(spec.headDim) + (spec.causal ? " causal" : " full");
}

}  // namespace mk

// mk-validate's ring-attention records (validate.hpp, "ring attention"): a record maps back to the schedule that ran,
// its lanes hold exactly the SMs of their CTAs, the rows join the fused table and its median, and a broken record
// is refused naming the field.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "mk/algorithms/attention.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/topology/topology.hpp"
#include "mk/validation/prediction_cache.hpp"
#include "mk/validation/validate.hpp"
#include "validate_fixtures.hpp"

namespace {

using mkt::contains;
using mkt::datasheet;
using mkt::errorOf;
using mkt::file;

/// A ring-attention record as mk-bench ring-attention writes it: `ranks` ranks as nodes of one rank sharing one GPU
/// (MPS), causal, 2048 tokens per rank, 8 / 2 heads of 128.
mk::MeasurementRecord ringRecord(uint32_t ranks, double timeUs = 1000.0) {
  mk::MeasurementRecord r;
  r.op = "ring-attention";
  r.impl = "mkernel";
  r.algo = "ring-zigzag";
  r.dtype = "bfloat16";
  r.ranks = ranks;
  r.bytes = 1;
  r.timeUs = timeUs;
  r.iters = 10;
  r.stat = "median";
  r.extra = {{"batch", "1"},
             {"seq_per_rank", "2048"},
             {"q_heads", "8"},
             {"kv_heads", "2"},
             {"head_dim", "128"},
             {"causal", "true"},
             {"nodes", std::to_string(ranks)},
             {"shared_gpu", "true"},
             {"processes", std::to_string(ranks)},
             {"transport", "\"socket\""},
             {"ctas", "63"},
             {"compute_ctas", "48"},
             {"comm_ctas", "15"}};
  return r;
}

/// Nodes of one GPU (132 SMs) each, as the loopback runs place ranks.
const char* kOnePerNode = R"({"schema": "mkernel.topology.v1", "name": "one-per-node", "nodes": 4,
  "node": {"gpu": "NVIDIA H100 80GB HBM3", "gpus": 1, "sms": 132, "bf16Tflops": 989, "hbmGBs": 3350,
           "nvlink": {"bwGBs": 450, "latencyUs": 0.65, "switched": false}, "pcie": {"bwGBs": 64, "latencyUs": 1.0},
           "nics": 1, "nic": {"bwGBs": 2, "latencyUs": 10}},
  "fabric": {"kind": "rail-leaf-spine", "nodesPerLeaf": 32, "oversubscription": 1, "switchLatencyUs": 0}})";

/// A topology file for the test's lifetime.
struct TopologyFile {
  TopologyFile() {
    std::FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs(kOnePerNode, f);
    std::fclose(f);
  }
  ~TopologyFile() { std::remove(path.c_str()); }
  std::string path = "validate-ring-attention-one-per-node.json";
};

mk::Profile profileWithAttention() {
  mk::Profile p = datasheet();
  p.attentionTflops = 0.5 * p.gemmTflops;
  return p;
}

}  // namespace

TEST_CASE("validate: a ring-attention record maps back to its spec, placement and CTAs") {
  const mk::RingAttentionRecordRequest q = mk::ringAttentionRecordRequest(ringRecord(4), "f.json");
  CHECK(q.nRanks == 4);
  CHECK(q.nodes == 4);
  CHECK(q.sharedGpu);
  CHECK(q.transport == "socket");
  CHECK(q.spec.seq == 8192);
  CHECK(q.spec.qHeads == 8);
  CHECK(q.spec.kvHeads == 2);
  CHECK(q.spec.headDim == 128);
  CHECK(q.spec.causal);
  CHECK(q.spec.scale == 0);
  CHECK(q.spec.dtype == mk::DType::BFloat16);
  CHECK(q.ctas == 63);
  CHECK(q.computeCtas == 48);
  CHECK(q.commCtas == 15);
  CHECK(mk::describeRingAttention(q.spec) == "S 8192 h 8/2 D128 causal");
  mk::RingAttentionSpec two = q.spec;
  two.batch = 2;
  two.causal = false;
  CHECK(mk::describeRingAttention(two) == "B2 S 8192 h 8/2 D128 full");
}

TEST_CASE("validate: a ring-attention record's compute lane gets exactly its CTAs' SMs of the attention rate") {
  const mk::Profile p = profileWithAttention();
  const mk::RingAttentionRecordRequest q = mk::ringAttentionRecordRequest(ringRecord(2), "f.json");
  const mk::Schedule s = mk::ringAttentionRecordSchedule(q, {0, 1});
  for (const auto& lanes : s.lanes) {
    REQUIRE(lanes.size() == 2);
    CHECK(lanes[0].ctas == 48);
    CHECK(lanes[1].ctas == 15);
  }
  const mk::Profile held = mk::heldSmsProfile(p, 63);
  CHECK(held.sms == 63);
  CHECK(held.attentionTflops == doctest::Approx(p.attentionTflops * 63 / p.sms));
  CHECK(held.gemmTflops == doctest::Approx(p.gemmTflops * 63 / p.sms));
  CHECK(held.ctaGBs == p.ctaGBs);
  CHECK(held.nvlink.bwGBs == p.nvlink.bwGBs);
  // Every attention step at attentionTflops x 48 / sms (its work units fill 48 SMs): the lane's own SMs, not a share
  // of the whole GPU by the lanes' weights (which would give it 132 x 48 / 63).
  const mk::Timeline t = mk::simulateUncontended(s, held);
  std::size_t n = 0;
  for (const mk::StepTime& st : t.steps) {
    const mk::Step& step = s.lanes[st.rank][st.lane].steps[st.step];
    if (step.kind != mk::StepKind::Attention) continue;
    const mk::AttentionShape& sh = s.attentions[step.aux];
    REQUIRE(uint64_t{sh.batch} * sh.qHeads * ((sh.sq + 127) / 128) >= 48);
    CHECK(st.endUs - st.startUs == doctest::Approx(step.flops / (p.attentionTflops * 1e6 * 48 / p.sms)));
    ++n;
  }
  CHECK(n > 0);
  // All of the GPU, or a profile without SMs: unchanged; more CTAs than the GPU has SMs: refused.
  CHECK(mk::heldSmsProfile(p, p.sms).attentionTflops == p.attentionTflops);
  mk::Profile noSms = p;
  noSms.sms = 0;
  CHECK(mk::heldSmsProfile(noSms, 63).attentionTflops == p.attentionTflops);
  CHECK(contains(errorOf([&] { mk::heldSmsProfile(p, 200); }), "hold 200 CTAs, but the profile's GPU has 132 SMs"));
}

TEST_CASE("validate: ring-attention records join the fused table, predicted by the replay of the schedule that ran") {
  const TopologyFile topo;
  const mk::Profile p = profileWithAttention();
  // The schedule by hand: the generator's, its lanes holding 48 and 15 CTAs, priced on the 63 SMs they held.
  mk::RingAttentionSpec spec;
  spec.qHeads = 8;
  spec.kvHeads = 2;
  spec.headDim = 128;
  spec.seq = 4096;
  spec.causal = true;
  spec.computeCtas = 48;
  mk::Schedule s = mk::generateRingAttention(spec, {0, 1});
  for (auto& lanes : s.lanes) lanes[1].ctas = 15;
  mk::Profile filled = p;
  mk::fillCtaDefaults(filled, mk::loadTopology(topo.path));
  REQUIRE(filled.sms == 132);
  filled.sms = 63;
  filled.attentionTflops *= 63.0 / 132;
  filled.gemmTflops *= 63.0 / 132;
  const mk::Topology placed = mk::placeRecordRanks(topo.path, 2, 2);
  const double simUs =
      mk::predictTotals({mk::TotalJob{&s, &placed, &filled}}, 1, nullptr, [](std::size_t) { return "ring"; })[0];
  std::vector<mk::MeasurementRecord> recs{ringRecord(2, simUs), ringRecord(2, 1.25 * simUs)};
  mk::ValidationOptions o;
  o.jobs = 1;
  const mk::FusedValidation v = mk::validateFused({file(recs)}, {"f.json"}, topo.path, p, o);
  REQUIRE(v.rows.size() == 2);
  CHECK(v.skipped.empty());
  CHECK(v.rows[0].ring.has_value());
  CHECK(v.rows[0].opName() == "ring-attention");
  CHECK(v.rows[0].ranks() == 2);
  CHECK(v.rows[0].gpusPerNode == 1);
  CHECK(std::fabs(v.rows[0].simErrPct) < 1e-9);
  CHECK(v.rows[1].simErrPct == doctest::Approx(100.0 * (1 / 1.25 - 1)));
  CHECK(v.rows[0].closedUs == doctest::Approx(mk::simulateUncontended(s, filled, placed).totalUs));
  CHECK(v.sim.n == 2);  // in the fused median
  const std::string table = mk::formatFusedTable(v);
  CHECK(contains(table, "ring-att"));
  CHECK(contains(table, "S 4096 h 8/2 D128 causal"));
  CHECK(contains(table, "1x2s"));
  CHECK(contains(table, "48/15"));
  const nlohmann::json j = nlohmann::json::parse(mk::fusedValidationToJson(v, 10.0));
  CHECK(j["rows"][0]["op"] == "ring-attention");
  CHECK(j["rows"][0]["seq"] == 4096);
  CHECK(j["rows"][0]["compute_ctas"] == 48);
  // --op / --algo select collectives: left out, counted, as the other fused records.
  o.ops = {"allreduce"};
  CHECK(mk::validateFused({file(recs)}, {"f.json"}, topo.path, p, o).filtered == 2);
}

TEST_CASE("validate: a bad ring-attention record is refused naming the field unless skipped") {
  auto errorFor = [](const std::function<void(mk::MeasurementRecord&)>& edit) {
    mk::MeasurementRecord r = ringRecord(2);
    edit(r);
    return errorOf([&] { mk::ringAttentionRecordRequest(r, "f.json: records[0]"); });
  };
  for (const char* k :
       {"seq_per_rank", "batch", "q_heads", "kv_heads", "head_dim", "ctas", "compute_ctas", "comm_ctas"}) {
    CAPTURE(k);
    CHECK(contains(errorFor([&](auto& r) { r.extra.erase(k); }),
                   std::string("f.json: records[0]: missing field '") + k + "'"));
  }
  CHECK(contains(errorFor([](auto& r) { r.extra.erase("causal"); }), "missing field 'causal'"));
  CHECK(contains(errorFor([](auto& r) { r.extra["causal"] = "\"yes\""; }), "field 'causal'"));
  CHECK(contains(errorFor([](auto& r) { r.extra["seq_per_rank"] = "0"; }), "field 'seq_per_rank'"));
  CHECK(contains(errorFor([](auto& r) { r.extra["seq_per_rank"] = "\"2048\""; }), "field 'seq_per_rank'"));
  CHECK(contains(errorFor([](auto& r) { r.extra["seq_per_rank"] = "2047"; }), "fields batch, seq_per_rank"));
  CHECK(contains(errorFor([](auto& r) { r.extra["kv_heads"] = "3"; }), "fields batch, seq_per_rank"));
  CHECK(contains(errorFor([](auto& r) { r.extra["ctas"] = "62"; }), "field 'ctas' 62 is less than compute_ctas 48"));
  CHECK(contains(errorFor([](auto& r) { r.extra["comm_ctas"] = "0"; }), "field 'comm_ctas'"));
  CHECK(contains(errorFor([](auto& r) { r.extra["nodes"] = "3"; }), "does not divide the record's 2 ranks"));
  CHECK(contains(errorFor([](auto& r) { r.dtype = "bf16x"; }), "dtype"));
  const TopologyFile topo;
  mk::MeasurementRecord bad = ringRecord(2);
  bad.extra.erase("seq_per_rank");
  mk::ValidationOptions o;
  o.jobs = 1;
  CHECK(contains(errorOf([&] { mk::validateFused({file({bad})}, {"f.json"}, topo.path, datasheet(), o); }),
                 "f.json: records[0] (ring-attention 2 x ? tokens, 8/2 heads): missing field 'seq_per_rank'"));
  o.skipBad = true;
  mk::MeasurementRecord wide = ringRecord(2);  // more CTAs than the GPU has SMs: the model cannot split it
  wide.extra["ctas"] = "200";
  wide.extra["compute_ctas"] = "180";
  const mk::FusedValidation v = mk::validateFused({file({bad, wide})}, {"f.json"}, topo.path, datasheet(), o);
  CHECK(v.rows.empty());
  REQUIRE(v.skipped.size() == 2);
  CHECK(contains(v.skipped[0].reason, "seq_per_rank"));
  CHECK(contains(v.skipped[1].reason, "not priced"));
  CHECK(contains(v.skipped[1].reason, "hold 195 CTAs, but the profile's GPU has 132 SMs"));
}

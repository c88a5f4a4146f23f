// mkernel — the judge: predict every measured collective of the resident kernel with the simulator and the
// closed form, from a hardware profile, and say how far each prediction is from the measurement
// (docs/validation.md).
//
// Honesty rules the code enforces:
//   - the schedule predicted is regenerated from the record's own fields (op, algo, dtype, ranks, count, chunks,
//     channels): the one the engine ran, not a look-alike; a record that cannot be regenerated is an error;
//   - measured numbers are only read, never adjusted; there is no per-size or per-algorithm correction;
//   - the profile must not have been fitted on a file whose collective records are validated
//     (checkProfileIndependence).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/attention.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/cost/cost.hpp"
#include "mk/cost/profile_io.hpp"
#include "mk/io/measurement.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/sim/replay.hpp"
#include "mk/topology/topology.hpp"
#include "mk/validation/prediction_cache.hpp"
#include "mk/validation/system_cluster.hpp"

namespace mk {

/// Schema name of mk-validate's JSON output (validationToJson).
inline constexpr const char* kValidationSchema = "mkernel.validation.v1";

/// A measurement record turned back into the request that produced it.
struct RecordSchedule {
  CollectiveSpec spec;        ///< spec.algo is the generator ("auto:ring" -> Algorithm::Ring)
  GenOptions gen;             ///< chunks, channels as recorded
  uint32_t nRanks = 0;        ///< the record's ranks
  uint32_t nodes = 0;         ///< the record's nodes (a multi-node run's "nodes"; 0: not recorded, one placement)
  bool inPlace = false;       ///< the engine staged the input first (one device copy before the schedule)
  bool chosenByAuto = false;  ///< the record's algo was "auto:<generator>"
};

/// True for the records mk-validate predicts: impl "mkernel" and op allreduce, allgather, reducescatter,
/// broadcast or alltoall. Everything else (nccl baselines, calib-* micro-benchmarks, enqueue-to-first-step)
/// is counted and ignored.
bool isValidatedRecord(const MeasurementRecord& r) noexcept;

/// Map a validated record to its schedule request. Required: op, algo ("<generator>" or "auto:<generator>";
/// plain "auto" does not say what ran), dtype, ranks, bytes, chunks, channels (>= 1). Optional: count (else
/// derived from bytes, which must then hold whole elements), redop ("sum"), inplace (false), root (0,
/// broadcast). The count must give exactly the record's bytes (mk::opBytes). Throws Error(InvalidArgument)
/// whose message starts with `where` ("f.json: records[7] (allreduce ring 1024 B)") and says what was expected
/// and what was seen.
RecordSchedule recordSchedule(const MeasurementRecord& r, const std::string& where);

/// (predicted - measured) / measured * 100.
double errorPct(double predictedUs, double measuredUs) noexcept;

/// Statistics of absolute errors in percent.
struct ErrorStats {
  std::size_t n = 0;
  double medianAbsPct = 0;  ///< median of |err| (mean of the two middle values for even n)
  double p90AbsPct = 0;     ///< 90th percentile of |err|, linear interpolation between order statistics
  double maxAbsPct = 0;
};
/// Stats of |e| over `errPct` (signed errors accepted); all zero for an empty input.
ErrorStats errorStats(const std::vector<double>& errPct);

/// "validation: n=<N> median_abs_err_pct=<x> p90_abs_err_pct=<y> max_abs_err_pct=<z>" (two decimals).
std::string formatSummaryLine(const ErrorStats& s, const std::string& prefix = "validation");

/// One predicted record.
struct ValidationRow {
  std::string file;        ///< name of the measurement file as given
  std::size_t index = 0;   ///< index in the file's "records"
  std::string algo;        ///< as recorded ("auto:ring")
  RecordSchedule request;  ///< what was regenerated
  uint64_t bytes = 0;      ///< nccl-tests size, as recorded
  uint64_t steps = 0;      ///< steps of the regenerated schedule
  double measuredUs = 0;
  double simUs = 0;                ///< mk::sim::predict (exact mode) + stagingUs
  std::optional<double> closedUs;  ///< mk::closedForm + stagingUs; none when the generator has no closed form
  double stagingUs = 0;            ///< in-place input staging (a local copy of the input), 0 out of place
  double simErrPct = 0;
  std::optional<double> closedErrPct;
};

/// A record that could not be regenerated (only kept with ValidationOptions::skipBad).
struct SkippedRecord {
  std::string file;       ///< measurement file as given
  std::size_t index = 0;  ///< index in its "records"
  std::string reason;     ///< the error message that would have stopped the run
};

/// Per input file: what was done with its records.
struct FileSummary {
  std::string name;
  std::string cluster;        ///< inferred from its system block ("" when not inferable)
  std::string runCommit;      ///< the measuring run's commit
  std::size_t records = 0;    ///< records in the file
  std::size_t validated = 0;  ///< predicted (rows)
  std::size_t ignored = 0;    ///< not mkernel collectives
  std::size_t filtered = 0;   ///< left out by ValidationOptions::ops / algos
  std::size_t skipped = 0;    ///< not regenerable (ValidationOptions::skipBad)
};

/// What to validate and how.
struct ValidationOptions {
  std::string cluster;           ///< preset or topology file; "" = infer from every file's system block
  std::vector<std::string> ops;  ///< only these ops (empty: all)
  /// Only these algorithms (empty: all); an entry matches the recorded algo ("auto:ring") or the generator
  /// it names ("ring" matches "ring" and "auto:ring").
  std::vector<std::string> algos;
  unsigned jobs = 2;     ///< predictions run at once (each forks a simulating process)
  bool skipBad = false;  ///< records that cannot be regenerated: skip and list instead of throwing
  /// Memory all predictions running at once may take (mk/resources.hpp; 0: defaultMaxMemory()): a record whose
  /// schedule and simulation need more than its share (maxMemory / jobs) is bad input, refused before it runs.
  uint64_t maxMemory = 0;
  PredictionCache* cache = nullptr;  ///< predictions kept between runs (prediction_cache.hpp); nullptr: none
};

/// The outcome.
struct ValidationResult {
  std::string cluster;              ///< what the predictions ran on
  std::vector<ValidationRow> rows;  ///< in file order, then record order
  std::vector<SkippedRecord> skipped;
  std::vector<FileSummary> files;
  std::size_t ignored = 0;      ///< records of other kinds (nccl, calib-*, enqueue-to-first-step, ...)
  std::size_t filtered = 0;     ///< validated kinds left out by ops / algos
  ErrorStats sim;               ///< the gated statistic
  ErrorStats closed;            ///< over the rows that have a closed form
  std::size_t simulations = 0;  ///< distinct predictions the rows needed (rows of one request share one)
  std::size_t fromCache = 0;    ///< of those, how many ValidationOptions::cache held
};

/// Regenerate and predict every validated record of `files` (names parallel to files, used in messages).
/// Throws Error(InvalidArgument) for a record that cannot be regenerated (without skipBad), for files from
/// different systems or a system no preset matches when options.cluster is empty (the message asks for
/// --cluster), for unknown ops in options.ops, and when a record does not fit the cluster; Error(Internal)
/// when a simulating process dies.
ValidationResult validateMeasurements(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                                      const Profile& profile, const ValidationOptions& options = {});

/// True when `r` is validated under `options`' op and algorithm selection.
bool isSelected(const MeasurementRecord& r, const ValidationOptions& options);

/// Refuse a circular comparison: throws Error(InvalidArgument) when a file the profile's provenance lists as
/// fitted ("path (run commit sha)" entries) is one of `names` and holds at least one record that would be
/// validated (isValidatedRecord and isSelected). Files are the same when their canonical paths are equal or,
/// failing that, their file names are (profiles are often fitted on another machine, under other paths).
void checkProfileIndependence(const ProfileProvenance& provenance, const std::string& profileName,
                              const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                              const ValidationOptions& options = {});

/// A record's schedule and the placement it runs on.
struct Regenerated {
  Schedule schedule;  ///< what mk::generate gives for the record
  Topology topo;      ///< the cluster with the record's ranks placed (mk::placeRanks)
};
/// The schedule of `row` regenerated on `cluster` (the same calls validateMeasurements makes), for one detailed
/// prediction (a trace).
Regenerated regenerate(const ValidationRow& row, const std::string& cluster);

/// One step side by side: predicted, and measured when a measured trace was given.
struct StepComparison {
  uint32_t rank = 0, lane = 0, step = 0;         ///< Schedule::lanes[rank][lane].steps[step]
  std::string kind;                              ///< step kind ("put", "wait", ...)
  double simStartUs = 0, simDurUs = 0;           ///< predicted, from the enqueue
  std::optional<double> measStartUs, measDurUs;  ///< measured, aligned as SideBySide::note says
};

/// A Perfetto trace of one record, measured and predicted side by side.
struct SideBySide {
  std::string json;                    ///< Chrome / Perfetto trace-event JSON
  std::vector<StepComparison> steps;   ///< in (rank, lane, step) order
  std::optional<uint64_t> measuredOp;  ///< which op of the measured trace was used
  std::string note;                    ///< how the two timelines are aligned, or why only one is shown
};

/// Put the predicted per-step timeline of `s` (StepRecords from mk::sim::predict with trace) next to the
/// measured one from `measuredTraceJson` (mk::traceToChromeJson's format, mk-bench --trace: pid = rank,
/// args {op, step, lane}; traces without args.lane have tid = lane), or alone when measuredTraceJson is empty. Measured
/// ranks become pids "measured rank r", predicted ones "simulated rank r", in adjacent rows. The measured op is
/// `measuredOp`, or else the only op of the trace whose steps are the schedule's steps (same rank, lane, step and
/// kind). Each rank of the measured op is shifted so that its first step starts with that rank's first predicted step
/// (a GPU trace has no enqueue time, and each GPU's clock has its own offset). Written by mk::io::TraceWriter (tid =
/// lane + 1, whole nanoseconds). Throws Error(ParseError) naming `traceName` for a malformed trace,
/// Error(InvalidArgument) when no op, or more than one op without measuredOp, matches the schedule.
SideBySide sideBySideTrace(const Schedule& s, const sim::Prediction& predicted, const std::string& measuredTraceJson,
                           const std::string& traceName, std::optional<uint64_t> measuredOp, const std::string& title);

/// What the JSON and the report say about where the inputs came from.
struct ValidationContext {
  std::string profilePath;                ///< "" for datasheet defaults
  Profile profile;                        ///< what the predictions used
  ProfileProvenance provenance;           ///< from the profile file (tool "defaultProfile" for datasheet defaults)
  std::string honesty;                    ///< the sentence on how the profile was obtained
  std::string command;                    ///< mk-validate's command line
  std::string commit;                     ///< mk-validate's build commit
  std::optional<double> maxMedianErrPct;  ///< the gate, when given
  std::optional<double> maxMaxErrPct;     ///< the gate on the largest error, when given
  /// The layered baseline's line (validate_layered.hpp), when `impl: nccl` records were predicted; not owned.
  const struct LayeredValidation* layered = nullptr;
  std::optional<double> maxMedianErrNcclPct;  ///< its gate, when given
  /// The fused operators' line (validateFused), when fused records were predicted; not owned.
  const struct FusedValidation* fused = nullptr;
  std::optional<double> maxMedianErrFusedPct;  ///< its gate, when given
};

/// How the profile was obtained, in one sentence for the report: fitted by mk-calibrate on micro-benchmark
/// records only (it reads only calib-* records), datasheet defaults, or another tool's.
std::string honestyStatement(const std::string& profilePath, const Profile& profile, const ProfileProvenance& prov);

/// {"schema": "mkernel.validation.v1", "cluster", "profile": {...}, "honesty", "files": [...], "summary":
/// {"sim": {n, median_abs_err_pct, p90_abs_err_pct, max_abs_err_pct}, "closed_form": {...}}, "rows": [...],
/// "skipped": [...], "trace": {...}?}. Format: docs/validation.md.
std::string validationToJson(const ValidationResult& result, const ValidationContext& ctx,
                             const SideBySide* trace = nullptr, const ValidationRow* traceRow = nullptr,
                             const std::string& traceFile = "", const std::string& measuredTrace = "");

/// The table mk-validate prints: op, algo, bytes, chunks x channels, measured, simulated, closed form (us),
/// sim err %, closed err %; one header line.
std::string formatValidationTable(const ValidationResult& result);

/// The cluster `cluster` with `nRanks` ranks placed as a record's run placed them: node-major, and, when `nodes` > 0,
/// exactly that many nodes of nRanks / nodes ranks each (the cluster must have that many GPUs per node). Throws
/// Error(InvalidArgument) saying which topology to give --cluster.
Topology placeRecordRanks(const std::string& cluster, uint32_t nRanks, uint32_t nodes);

// ---- the fused operators (validate_fused.cpp): gemm-rs, ag-gemm, gemm-ar records of our engine, predicted with the
// fused model (mk::planFused's closed form, then the SimGrid replay of mk::generate's schedule: mk-sim --op gemm-rs's
// path), on a line of their own (docs/validation.md, "Fused operators") ----

/// A fused-operator record turned back into the request that produced it.
struct FusedRecordRequest {
  FusedSpec spec;
  FusedOptions opt;        ///< concrete: the options that ran (order, tile rows, ctas, comm CTAs, compute lanes)
  uint32_t nRanks = 0;     ///< the record's ranks
  uint32_t nodes = 0;      ///< the record's nodes (ranks as nodes over the proxy); 0: one node
  bool sharedGpu = false;  ///< the ranks shared one GPU: each is priced on its own CTAs' SMs (heldSmsProfile)
  std::string transport;   ///< the record's transport across nodes ("" on one node)
};

/// True for the fused records mk-validate predicts: impl "mkernel" and op gemm-rs, ag-gemm or gemm-ar.
bool isFusedRecord(const MeasurementRecord& r) noexcept;

/// Map a fused record to its request. Required: op, dtype (16-bit), ranks, m, n, k, order (not "auto"), tile_rows,
/// compute_ctas, comm_ctas. Optional: ctas (= compute_ctas + comm_ctas, which it must equal), compute_lanes (1),
/// layout_b ("row"), shared_gpu (false), nodes (dividing ranks), ranks_per_node (= ranks / nodes), transport. The
/// shape must pass validateFusedSpec. Throws Error(InvalidArgument or ParseError) whose message starts with `where`
/// and names the field.
FusedRecordRequest fusedRecordRequest(const MeasurementRecord& r, const std::string& where);

/// Where a fused record's ranks run in the model: with nodes, ranks as nodes (placeRecordRanks: the cluster must have
/// ranks / nodes GPUs per node, ProxyPuts across nodes); without, one node of `cluster`, widened to the record's ranks
/// when they shared one GPU and the node has fewer (as the engine prices a shared GPU: a node of that many GPUs like
/// it). Throws Error(InvalidArgument) when the ranks do not fit.
Topology fusedRecordTopology(const std::string& cluster, const FusedRecordRequest& q);
/// The same placement for `nRanks` ranks on `nodes` nodes (0: one), `sharedGpu` as the record says.
Topology fusedRecordTopology(const std::string& cluster, uint32_t nRanks, uint32_t nodes, bool sharedGpu);

// ---- ring attention (ring_attention_records.cpp): mk-bench ring-attention's records, in the fused table ----

/// A ring-attention record of our engine turned back into what ran.
struct RingAttentionRecordRequest {
  RingAttentionSpec spec;    ///< seq = ranks x seq_per_rank, bf16, the default scale, computeCtas = compute_ctas
  uint32_t nRanks = 0;       ///< the record's ranks
  uint32_t nodes = 0;        ///< the record's nodes (ranks as nodes over the proxy); 0: one node
  bool sharedGpu = false;    ///< the ranks shared one GPU (MPS): each held only its own CTAs' SMs
  std::string transport;     ///< across nodes ("" on one node)
  uint32_t ctas = 0;         ///< the rank's worker CTAs of the resident kernel
  uint32_t computeCtas = 0;  ///< the CTAs the engine's lowering gave rank 0's compute lane
  uint32_t commCtas = 0;     ///< ... and its send lane (computeCtas + commCtas <= ctas)
};

/// True for the ring-attention records mk-validate predicts: impl "mkernel", op "ring-attention".
bool isRingAttentionRecord(const MeasurementRecord& r) noexcept;

/// Map a ring-attention record (mk-bench ring-attention) to what ran. Required: dtype "bfloat16", ranks, batch,
/// seq_per_rank, q_heads, kv_heads, head_dim, causal (true / false), ctas, compute_ctas, comm_ctas (>= 1 each,
/// compute_ctas + comm_ctas <= ctas). Optional: nodes (dividing ranks), shared_gpu (false), transport. The shape must
/// pass validateRingAttentionSpec. Throws Error(InvalidArgument or ParseError) whose message starts with `where` and
/// names the field.
RingAttentionRecordRequest ringAttentionRecordRequest(const MeasurementRecord& r, const std::string& where);

/// The schedule the record ran: generateRingAttention on `nodeOf`, every rank's compute lane holding computeCtas and
/// its send lane commCtas (Lane::ctas: CTAs, one SM each). Price it under heldSmsProfile(profile, computeCtas +
/// commCtas), so that each lane computes with exactly its own CTAs' SMs. Throws what generateRingAttention throws.
Schedule ringAttentionRecordSchedule(const RingAttentionRecordRequest& q, const std::vector<uint32_t>& nodeOf);

/// The GPU as a rank whose lanes hold `heldSms` of its SMs (the sum of their Lane::ctas, one SM per CTA) sees it: sms
/// = heldSms and the tensor rates (gemmTflops, attentionTflops) times heldSms / p.sms; every other field as in `p`.
/// Rule 2b splits a computing rank's sms by its lanes' CTAs (laneSms = sms x lane / rank CTAs) and caps a lane's
/// tensor steps at rate x its SMs / sms, so under this profile a lane computes at p's rate x its own CTAs / p.sms:
/// the SMs it held, where under `p` the lanes would split the whole GPU by their weights. What a rank sharing its GPU
/// (MPS) or leaving SMs idle had. `p` itself when p.sms is 0 (rule 2b off) or heldSms is p.sms; throws
/// Error(InvalidArgument) when heldSms is 0 or above p.sms.
Profile heldSmsProfile(const Profile& p, uint32_t heldSms);

/// The shape column of the fused table: "S 16384 h 32/8 D128 causal" (B is shown when > 1: "B2 S ...").
std::string describeRingAttention(const RingAttentionSpec& spec);

/// One predicted fused record.
struct FusedRow {
  std::string file;
  std::size_t index = 0;                           ///< in the file's "records"
  FusedRecordRequest request;                      ///< a gemm-rs, ag-gemm or gemm-ar record (ring unset)
  std::optional<RingAttentionRecordRequest> ring;  ///< a ring-attention record (request then unused)
  uint32_t gpusPerNode = 0;                        ///< of the placement the model used
  double measuredUs = 0;
  double simUs = 0;     ///< the SimGrid replay (mk::sim::predict) of the schedule
  double closedUs = 0;  ///< mk::fusedClosedForm of the same options; ring-attention: the uncontended timeline
  /// The op's name in tables: gemm-rs, ag-gemm, gemm-ar or ring-attention.
  std::string opName() const;
  /// The record's ranks.
  uint32_t ranks() const noexcept { return ring ? ring->nRanks : request.nRanks; }
  double simErrPct = 0, closedErrPct = 0;
};

/// The fused line over every file.
struct FusedValidation {
  std::vector<FusedRow> rows;
  std::vector<SkippedRecord> skipped;  ///< records the model could not price (placement, split), with the reason
  std::size_t filtered = 0;            ///< left out by ValidationOptions::ops / algos (they select collectives)
  std::vector<std::string> filled;     ///< profile fields taken from the datasheet (mk::fillCtaDefaults)
  ErrorStats sim;                      ///< the gated statistic (--max-median-err-fused)
  ErrorStats closed;
};

/// Predict every fused record (isFusedRecord, isRingAttentionRecord) of `files` on `cluster` under `profile` (its
/// missing sms / ctaGBs from the datasheet), `options.jobs` simulations at once, from `options.cache`. A record that
/// breaks the record contract (fusedRecordRequest, ringAttentionRecordRequest, or above its share of
/// options.maxMemory) throws unless options.skipBad; one the model cannot place or split is skipped with the reason.
/// Records are left out when options.ops or options.algos are given. A ring-attention row's closed form is the
/// uncontended timeline of its schedule (the generator has no closed form of its own).
FusedValidation validateFused(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                              const std::string& cluster, const Profile& profile, const ValidationOptions& options);

/// The fused table: op, m x n x k (ring-attention: its shape, describeRingAttention), ranks x nodes, tile, order,
/// compute / comm CTAs, lanes, measured, simulated, closed form (us), both errors; one header line.
std::string formatFusedTable(const FusedValidation& v);

/// The "fused" section of mk-validate's JSON (docs/validation.md) as JSON text, with the gate when given.
std::string fusedValidationToJson(const FusedValidation& v, std::optional<double> maxMedianErrPct);

}  // namespace mk

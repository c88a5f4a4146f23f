// mkernel — the measurement file contract ("mkernel.measurement.v1", the structs below): read, check, write.
//
// Measured numbers are data: this code never rounds or alters a value it reads; it only checks that the
// contract's fields are there, typed as promised and physically possible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mk {

/// One measured point.
struct MeasurementRecord {
  std::string op;    ///< "allreduce", "gemm", "calibrate-put", ...
  std::string impl;  ///< "mkernel", "nccl", "cublas", "cublas+nccl", ...
  std::string algo;  ///< generator name or "" for baselines without one
  std::string dtype;
  uint32_t ranks = 0;
  uint64_t bytes = 0;
  double timeUs = 0;
  double algbwGBs = 0;
  double busbwGBs = 0;
  uint64_t iters = 0;
  std::string stat;  ///< "median", ...
  /// Every other field of the record (shape m/n/k, sms, tflops, what a micro-benchmark varies...) as JSON text.
  std::map<std::string, std::string> extra;
};

/// One measurement file.
struct MeasurementFile {
  std::string schema;                         ///< "mkernel.measurement.v1"
  std::map<std::string, std::string> system;  ///< gpu, gpus, link, driver, cuda, nccl (values as JSON text)
  std::string date, commit, command;          ///< the "run" object
  std::vector<MeasurementRecord> records;
};

/// Parse and check; throws Error(ParseError) naming the file, the record index and the field
/// ("x.json: records[3].time_us: must be a finite number > 0 (got -1)"). Records of the fused operators (op
/// "gemm-rs", "ag-gemm", "gemm-ar") must also carry their shape and SMs as positive integers (`m`, `n`, `k`, `sms`),
/// and those of impl "mkernel" the split that ran: `tile_rows`, `compute_ctas` (> 0) and `comm_ctas` (rank 0's CTAs of
/// the compute and communication lanes). Every field is checked at the field (mk/io/json.hpp): `ranks` fits 32
/// bits, `bytes` at most kMaxElements, times finite in (0, one hour], and a record's `chunks` / `channels`, when
/// present, within the generators' kMaxChunks / kMaxChannels.
MeasurementFile parseMeasurementFile(const std::string& jsonText, const std::string& nameForErrors = "<text>");
MeasurementFile loadMeasurementFile(const std::string& path);
/// Load every file of a tool's list of inputs, in order. The same file given twice, under any two spellings
/// (a.json and ./a.json, a link and its target: compared by device and inode), is refused with
/// Error(InvalidArgument) naming both before anything is read: its records would count twice in a fit or a
/// median.
std::vector<MeasurementFile> loadMeasurementFiles(const std::vector<std::string>& paths);

/// Serialise back (extra fields preserved); written atomically by saveMeasurementFile.
std::string measurementFileToJson(const MeasurementFile& f);
void saveMeasurementFile(const MeasurementFile& f, const std::string& path);

}  // namespace mk

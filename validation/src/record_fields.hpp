// mkernel — reading the extras of an operator record (mk-bench's fused and ring-attention records) inside mk-validate:
// one home for how a missing or mistyped field is refused, naming the record and the field.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "mk/io/measurement.hpp"
#include "mk/schedule/types.hpp"

namespace mk::record_fields {

/// A field of the record (kept as JSON text by the measurement parser); none when absent.
std::optional<nlohmann::json> field(const MeasurementRecord& r, const char* key);

/// A whole number field in [min, 2^32); `required` makes its absence an error.
std::optional<uint32_t> countField(const MeasurementRecord& r, const char* key, const std::string& where, bool required,
                                   uint32_t min);

/// Throws Error(InvalidArgument) "`where`: `what`".
[[noreturn]] void bad(const std::string& where, const std::string& what);

/// The record's element type (its "dtype", any mk::DType name).
DType dtypeOf(const MeasurementRecord& r, const std::string& where);

/// The record's ranks (>= 1).
uint32_t ranksOf(const MeasurementRecord& r, const std::string& where);

/// Where an operator record's ranks ran, from its optional fields.
struct RecordPlacement {
  uint32_t nodes = 0;      ///< "nodes", dividing the ranks into equal nodes; 0 without it or for 1 (one node)
  bool sharedGpu = false;  ///< "shared_gpu"
  std::string transport;   ///< "transport" ("" without it)
};

/// Read "nodes", "ranks_per_node" (which needs "nodes" and must be nRanks / nodes), "shared_gpu" and "transport".
RecordPlacement placementOf(const MeasurementRecord& r, const std::string& where, uint32_t nRanks);

}  // namespace mk::record_fields

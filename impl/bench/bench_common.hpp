// mk-bench — helpers every subcommand shares: timing statistics and the measurement file's system metadata.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/validation/measurement.hpp"

namespace mkbench {

/// Host steady clock in nanoseconds.
double hostNs();
/// Median (mean of the two middle values for an even count); 0 for no value.
double median(std::vector<double> v);
/// Nearest-rank percentile, p in [0, 1]; 0 for no value.
double percentile(std::vector<double> v, double p);
/// `"s"` (a JSON string literal for MeasurementFile::system; s must need no escaping).
std::string quoted(const std::string& s);
/// Kernel driver version ("580.159.04"), else the CUDA driver API version.
std::string driverVersion();
/// "NV18": active NVLinks of GPU 0 through NVML (loaded at run time), or "" when NVML is not there.
std::string nvlinkName();
/// A measurement file with the system metadata of this machine (GPU 0's name and SMs, `gpus`, link — `link`
/// or NVML's —, driver, CUDA runtime), today's UTC date, the commit this binary was configured from and
/// `command`. Records are added by the caller.
mk::MeasurementFile newMeasurementFile(int gpus, const std::string& link, const std::string& command);

}  // namespace mkbench

// mkernel — which cluster preset a measurement file describes, from its "system" block.
#pragma once

#include <string>
#include <vector>

#include "mk/io/measurement.hpp"

namespace mk {

/// The topology preset a file was measured on, from its "system" block: the preset whose node has the same
/// GPU model ("gpu") and GPU count ("gpus"), the first in topologyPresets() order when several match (the DGX
/// presets come before the cloud nodes with the same GPUs). "" when none matches.
std::string inferCluster(const MeasurementFile& f);

/// The cluster the records of `files` are predicted on: `cluster` when given, else the one preset every file's
/// system block matches (inferCluster). Throws Error(InvalidArgument) naming the file whose system matches no
/// single preset, or the two files from different systems (the message asks for --cluster).
std::string resolveCluster(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                           const std::string& cluster);

}  // namespace mk

// mkernel — the manifest of fused operators measured across nodes (docs/validation.md, "Fused operators across
// nodes"): which files of a measurement directory are the session's calibration and which are the gated fused
// records, the topology they ran on, the preset whose datasheet fills what the calibration does not measure, and in
// words the regime they measured. A manifest is not a measurement: it lives in its own directory
// (validation/data/fused-validation/) and names the measurement directory it judges, which keeps only
// mkernel.measurement.v1 files (DESIGN.md, "Data contracts"). No simulator: the committed-data test reads it too.
// The chain it drives is validate_fused_nodes.hpp.
#pragma once

#include <string>
#include <vector>

namespace mk {

/// The manifests' schema.
inline constexpr const char* kFusedNodesSchema = "mkernel.fused-validation.v1";

/// A manifest, its paths resolved and its patterns expanded to files.
struct FusedNodesManifest {
  std::string path;                      ///< the manifest file as given
  std::string dir;                       ///< the measurement directory it judges, resolved against the manifest's
  std::string regime;                    ///< what was measured, in words ("ranks sharing one H100 ... loopback TCP")
  std::string topology;                  ///< the topology file the records ran on, resolved against the manifest's
  std::string base;                      ///< preset whose datasheet fills the unmeasured parameters ("dgx-h100")
  std::vector<std::string> calibration;  ///< dir/<file> of every calibration file, sorted by name
  std::vector<std::string> gated;        ///< dir/<file> of every gated record file, sorted by name
};

/// Read a manifest: {"schema": "mkernel.fused-validation.v1", "regime": text, "data": the measurement directory,
/// "topology": a topology file, "calibration_base": a topology preset, "calibration": [patterns], "gated":
/// [patterns]}; "data" and "topology" are relative to the manifest's own directory. A pattern is a file-name glob
/// (`*`, `?`, `[...]`) over the regular files of the data directory itself. Throws Error naming the manifest and the
/// field: IoError when it cannot be read; ParseError for malformed JSON, another schema, a missing, unknown or
/// mistyped field; InvalidArgument for a data directory or topology file that does not exist, a base that is not a
/// preset, a pattern with a '/' or one that matches no file, and a file both calibration and gated (the profile
/// would be fitted on what it judges).
FusedNodesManifest loadFusedNodesManifest(const std::string& path);

/// The manifests of `dir`: its regular *.json files (not its subdirectories'), sorted; none when `dir` is empty or
/// not a directory.
std::vector<std::string> findFusedNodesManifests(const std::string& dir);

}  // namespace mk

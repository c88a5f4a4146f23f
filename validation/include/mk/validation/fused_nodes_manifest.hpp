// mkernel — the manifest of a data directory of fused operators measured across nodes (docs/validation.md, "Fused
// operators across nodes"): which of its files are the session's calibration and which are the gated fused records,
// the topology they ran on, the preset whose datasheet fills what the calibration does not measure, and in words the
// regime they measured. No simulator: the committed-data test reads it too. The chain it drives is
// validate_fused_nodes.hpp.
#pragma once

#include <string>
#include <vector>

namespace mk {

/// The manifest's file name inside its data directory.
inline constexpr const char* kFusedNodesManifest = "fused-validation.json";
/// Its schema.
inline constexpr const char* kFusedNodesSchema = "mkernel.fused-validation.v1";

/// A data directory's manifest, its patterns resolved to files.
struct FusedNodesManifest {
  std::string dir;                       ///< the data directory as given
  std::string path;                      ///< the manifest file (dir/fused-validation.json)
  std::string regime;                    ///< what was measured, in words ("ranks sharing one H100 ... loopback TCP")
  std::string topology;                  ///< the topology file the records ran on, resolved against dir
  std::string base;                      ///< preset whose datasheet fills the unmeasured parameters ("dgx-h100")
  std::vector<std::string> calibration;  ///< dir/<file> of every calibration file, sorted by name
  std::vector<std::string> gated;        ///< dir/<file> of every gated record file, sorted by name
};

/// Read DIR/fused-validation.json: {"schema": "mkernel.fused-validation.v1", "regime": text, "topology": a topology
/// file relative to DIR, "calibration_base": a topology preset, "calibration": [patterns], "gated": [patterns]}.
/// A pattern is a file-name glob (`*`, `?`, `[...]`) over the regular files of DIR itself. Throws Error naming the
/// manifest and the field: ParseError for malformed JSON, another schema, a missing, unknown or mistyped field;
/// InvalidArgument for a topology file that does not exist, a base that is not a preset, a pattern with a '/' or
/// one that matches no file, and a file both calibration and gated (the profile would be fitted on what it judges).
FusedNodesManifest loadFusedNodesManifest(const std::string& dir);

/// The directories under `measuredDir` (itself included, at any depth) that hold a manifest, sorted; none when
/// `measuredDir` is empty or not a directory.
std::vector<std::string> findFusedNodesDirs(const std::string& measuredDir);

}  // namespace mk

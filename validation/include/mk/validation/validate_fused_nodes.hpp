// mkernel — the fused operators across nodes, judged as one manifest says (docs/validation.md, "Fused operators
// across nodes"): the manifest (fused_nodes_manifest.hpp) -> the profile fitted on its calibration files
// (mk-calibrate's fit, from the base preset's datasheet) -> every fused record of its gated files replayed on its
// topology (validateFused). The one home of that chain: mk-validate --fused-nodes (and through it ci_gate.sh
// --fused-internode) and the planner's `fused` confidence class both call it.
#pragma once

#include <string>

#include "mk/cost/profile_io.hpp"
#include "mk/validation/calibrate.hpp"
#include "mk/validation/fused_nodes_manifest.hpp"
#include "mk/validation/validate.hpp"

namespace mk {

/// The chain's outcome.
struct FusedNodesValidation {
  FusedNodesManifest manifest;
  FitReport fit;                 ///< mk-calibrate's fit on the calibration files
  Profile profile;               ///< the fitted profile on the manifest's topology, as mk-validate reads it
  ProfileProvenance provenance;  ///< the fitted files, the base preset as its machine
  std::string gpu;               ///< the GPU the gated records ran on (their files' system "gpu"; else the topology's)
  FusedValidation fused;
};

/// Run the chain of the manifest `manifestPath`: the profile is what `mk-calibrate --cluster <base> --out p.json
/// <calibration files>` writes, read back as `mk-validate --cluster <topology> --profile p.json` reads it (the same
/// numbers to the last bit), and the gated files' fused records are predicted by validateFused with `options` (jobs,
/// cache, skipBad, maxMemory; options.ops / algos / cluster are not used). Throws what loadFusedNodesManifest,
/// loadMeasurementFiles, calibrate and validateFused throw, each naming its file.
FusedNodesValidation validateFusedNodes(const std::string& manifestPath, const ValidationOptions& options);

}  // namespace mk

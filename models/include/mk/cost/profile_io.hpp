// mkernel — hardware profile <-> JSON ("schema": "mkernel.profile.v1").
//
// A profile file holds every field of mk::Profile under the same names as the struct (units in the name, as
// in the topology format), plus where the numbers came from:
//
//   { "schema": "mkernel.profile.v1",
//     "source": "calibrated on h200x2 (2026-12-01)",
//     "provenance": { "system": "h200x2", "date": "2026-12-01", "commit": "<sha>", "tool": "mk-calibrate",
//                     "measurements": ["validation/data/measured/....json"] },
//     "nvlink":  { "alphaUs": 0.65, "bwGBs": 369 },
//     "network": { "alphaUs": 3.5,  "bwGBs": 50 },
//     "local":   { "alphaUs": 0.5,  "bwGBs": 1965 },
//     "reduceGBs": 1310, "flagUs": 0.65, "dispatchUs": 2, "proxyUs": 2.5, "gemmTflops": 742,
//     "attentionTflops": 742, "sms": 132, "ctaGBs": 36.7 }
//
// Every numeric field is required, finite and >= 0 (a rate of 0 is allowed in the file: it only fails when a
// schedule needs it, with a message from the engine that needs it), except the fields added after the first
// profiles were written, which are optional and default as mk::Profile documents: localFlagUs (its flagUs),
// peerUserUs, putIssueUs, userPutUs, sms and ctaGBs (0 = not distinguished; sms a whole number), attentionTflops
// (attentionEfficiency in the efficiency form; without it, gemmTflops: the rate attention had before). The writer
// leaves sms and ctaGBs out when they are 0. "provenance" is optional on input. The layered baseline's fields are
// optional too and default to NCCL's documented design (cost.hpp, docs/algorithms-nccl.md):
//   "protocols": {"simple"|"ll"|"ll128": {"latencyUs": x, "bwFraction": f in (0, 1]}},
//   "nccl": {"hostOpUs": x, "groupGpuUs": x, "baseUs": {"ll": x, "ll128": x, "simple": x}}
// ("launchUs", the old name of hostOpUs, is still read; a file with both is refused).
#pragma once

#include <string>
#include <vector>

#include "mk/cost/cost.hpp"

namespace mk {

/// Where a profile's numbers came from. Not part of Profile itself: engines never read it, reports do.
struct ProfileProvenance {
  std::string system;                     ///< machine or preset the numbers describe ("h200x2")
  std::string date;                       ///< when they were fitted (ISO 8601)
  std::string commit;                     ///< git sha of the fitting tool
  std::string tool;                       ///< "mk-calibrate", "defaultProfile", "hand-edited", ...
  std::vector<std::string> measurements;  ///< measurement files the fit used
};

/// Serialise (all fields, sms and ctaGBs only when > 0; provenance written when any of its fields is set).
std::string profileToJson(const Profile& p, const ProfileProvenance& provenance = {}, int indent = 2);

/// The efficiency form (what mk-calibrate writes): "machine" names the preset the profile was measured on, and
/// its rates are fractions of that machine's datasheet rates (defaultProfile): nvlink.efficiency,
/// network.efficiency, local.efficiency, reduceEfficiency, gemmEfficiency, attentionEfficiency in place of
/// nvlink.bwGBs, ..., gemmTflops, attentionTflops; every other field as profileToJson writes it. `machine` must be
/// a preset.
std::string profileToEfficiencyJson(const Profile& p, const ProfileProvenance& provenance, const Topology& machine,
                                    int indent = 2);

/// Parse either form (the efficiency form read back as the machine's absolute rates, provenance.system = the
/// machine); throws Error(ParseError) for malformed JSON, a wrong schema, a missing, misspelt or mistyped field
/// (named: "profile: missing field nvlink.bwGBs"), and Error(InvalidArgument) for a negative or non-finite value
/// (named: "profile: nvlink.bwGBs must be >= 0 and finite (got -1)"). Fills `provenance` when given.
Profile profileFromJson(const std::string& text, ProfileProvenance* provenance = nullptr);

/// Read and parse a profile file; errors as profileFromJson (IoError when unreadable), with the path prefixed.
Profile loadProfile(const std::string& path, ProfileProvenance* provenance = nullptr);

/// Write atomically (writeFileAtomic): never a half-written file.
void saveProfile(const Profile& p, const std::string& path, const ProfileProvenance& provenance = {});

/// A profile measured on `machine`, applied to `target` (docs/calibration.md, "A profile on another cluster"):
/// every rate is the measured fraction of the machine's datasheet rate (defaultProfile) applied to the target's
/// (nvlink, network, local copy, reduce, GEMM); the link latencies keep our engine's fixed cost above the
/// datasheet latency; the transport model is the target NICs' when their kind differs. Where both datasheets
/// agree the number is unchanged, bit for bit: the profile on its own machine prices as measured.
Profile profileOnCluster(const Profile& p, const Topology& machine, const Topology& target);
/// The machine a profile was measured on: the preset its provenance.system names, else `fallback` (a profile
/// without a known machine holds the absolute rates of the cluster it is used with).
Topology profileMachine(const ProfileProvenance& provenance, const Topology& fallback);
/// loadProfile(path), then profileOnCluster(it, its machine, target).
Profile loadProfileFor(const std::string& path, const Topology& target, ProfileProvenance* provenance = nullptr);

}  // namespace mk

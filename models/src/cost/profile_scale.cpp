// mkernel — a profile measured on one machine, applied to another cluster's datasheet (profile_io.hpp).
#include <algorithm>

#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"

namespace mk {

namespace {

/// `measured` x target / machine: a fraction of the machine's datasheet rate, applied to the target's. Exactly
/// `measured` when both datasheets agree (target / machine is then 1), so that a profile applied to the
/// machine it was measured on prices to the last digit as before.
double scaled(double measured, double machine, double target) {
  if (!(machine > 0) || !(target > 0) || machine == target) return measured;
  return measured * (target / machine);
}

/// `measured` + target - machine: a fixed cost of our engine on top of the link's datasheet latency, moved to
/// the target's latency (never below 0).
double shifted(double measured, double machine, double target) {
  if (machine == target) return measured;
  return std::max(0.0, measured + (target - machine));
}

}  // namespace

Profile profileOnCluster(const Profile& p, const Topology& machine, const Topology& target) {
  const Profile m = defaultProfile(machine);
  const Profile t = defaultProfile(target);
  Profile out = p;
  out.nvlink.bwGBs = scaled(p.nvlink.bwGBs, m.nvlink.bwGBs, t.nvlink.bwGBs);
  out.nvlink.alphaUs = shifted(p.nvlink.alphaUs, m.nvlink.alphaUs, t.nvlink.alphaUs);
  out.flagUs = shifted(p.flagUs, m.flagUs, t.flagUs);
  // A machine without NICs has no network rate to take a fraction of: its profile's network numbers are either
  // that machine's datasheet fallback (then the target's datasheet replaces them, as the rule above gives) or
  // were measured on another system (a loopback run): those are kept as they are.
  const bool networkOfMachine =
      machine.node.nics > 0 || (p.network.bwGBs == m.network.bwGBs && p.network.alphaUs == m.network.alphaUs);
  if (networkOfMachine) {
    out.network.bwGBs = scaled(p.network.bwGBs, m.network.bwGBs, t.network.bwGBs);
    out.network.alphaUs = shifted(p.network.alphaUs, m.network.alphaUs, t.network.alphaUs);
  }
  out.local.bwGBs = scaled(p.local.bwGBs, m.local.bwGBs, t.local.bwGBs);
  out.reduceGBs = scaled(p.reduceGBs, m.reduceGBs, t.reduceGBs);
  out.gemmTflops = scaled(p.gemmTflops, m.gemmTflops, t.gemmTflops);
  out.attentionTflops = scaled(p.attentionTflops, m.attentionTflops, t.attentionTflops);
  if (p.sms == machine.node.sms) out.sms = target.node.sms;
  // The transport is the target NICs': a profile whose NICs used another kind keeps none of its numbers.
  if (t.transport.kind != p.transport.kind && target.node.nics > 0) out.transport = t.transport;
  const bool same = out.nvlink.bwGBs == p.nvlink.bwGBs && out.network.bwGBs == p.network.bwGBs &&
                    out.local.bwGBs == p.local.bwGBs && out.reduceGBs == p.reduceGBs &&
                    out.nvlink.alphaUs == p.nvlink.alphaUs && out.network.alphaUs == p.network.alphaUs &&
                    out.transport.kind == p.transport.kind;
  if (!same && machine.name != target.name)
    out.source += " [efficiencies on " + machine.name + " applied to " + target.name + "'s datasheet]";
  return out;
}

Topology profileMachine(const ProfileProvenance& provenance, const Topology& fallback) {
  const auto presets = topologyPresets();
  if (std::find(presets.begin(), presets.end(), provenance.system) == presets.end()) return fallback;
  return topologyPreset(provenance.system, 1);
}

Profile loadProfileFor(const std::string& path, const Topology& target, ProfileProvenance* provenance) {
  ProfileProvenance prov;
  const Profile p = loadProfile(path, &prov);
  const Profile out = profileOnCluster(p, profileMachine(prov, target), target);
  if (provenance != nullptr) *provenance = std::move(prov);
  return out;
}

}  // namespace mk

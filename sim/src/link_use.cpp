#include "mk/sim/link_use.hpp"

namespace mk::sim {

std::string linkKind(const std::string& name) {
  if (name.find(".nvl") != std::string::npos) return "NVLink";
  if (name.find(".nic") != std::string::npos) return "network";
  if (name.find(".pcie") != std::string::npos) return "PCIe";
  if (name.find("leaf") != std::string::npos || name.find("spine") != std::string::npos || name.rfind("rail", 0) == 0)
    return "fabric";
  return "link";
}

std::vector<ResourceUse> linkResourceUse(const std::vector<LinkLoad>& links) {
  std::vector<ResourceUse> uses;
  uses.reserve(links.size());
  for (const LinkLoad& l : links)
    if (l.bytes > 0) uses.push_back({l.name, linkKind(l.name), l.utilization});
  return uses;
}

}  // namespace mk::sim

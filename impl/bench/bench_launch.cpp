// mk-bench — the ranks one process drives and their communicators (bench_launch.hpp).
#include "bench_launch.hpp"

#include <utility>

namespace mkbench {

Launch launchFromEnvironment() {
  mk::RankLaunch rank = mk::bootstrapFromEnvironment(20000);
  Launch l;
  l.boot = std::move(rank.bootstrap);
  l.nRanks = l.boot->size();
  l.firstRank = l.boot->rank();
  l.devs = {rank.device};
  return l;
}

Launch launchLocal(std::vector<int> devs) {
  Launch l;
  l.nRanks = static_cast<int>(devs.size());
  l.devs = std::move(devs);
  return l;
}

std::vector<mk::Communicator> createCommunicators(const Launch& l, const mk::CommConfig& cfg) {
  std::vector<mk::Communicator> comms;
  if (l.multiProcess())
    comms.push_back(mk::Communicator::create(*l.boot, l.devs[0], cfg));
  else
    comms = mk::Communicator::createLocal(l.devs, cfg);
  return comms;
}

mk::ProxyTransport proxyTransport(const std::string& name) {
  if (name == "socket") return mk::ProxyTransport::Socket;
  if (name == "ibverbs") return mk::ProxyTransport::IbVerbs;
  return mk::ProxyTransport::Auto;
}

}  // namespace mkbench

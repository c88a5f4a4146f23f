// mk-bench — the ranks one process drives and their communicators: every GPU of this process (or several ranks on
// one GPU), or — started by torchrun, mpirun or impl/tools/launch_ranks.sh — one rank of a job of one process per
// rank, rendezvous and GPU chosen as Communicator::createFromEnvironment chooses them. The one home of that setup for
// every subcommand that runs on either (the collectives, the fused operators).
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mk/bootstrap.hpp"
#include "mk/communicator.hpp"

namespace mkbench {

/// `v` of every process, in rank order (one bootstrap all-gather).
template <class T>
std::vector<T> allGatherValue(mk::Bootstrap& boot, T v) {
  const std::vector<uint8_t> all = boot.allGather(&v, sizeof v);
  std::vector<T> out(all.size() / sizeof v);
  std::memcpy(out.data(), all.data(), out.size() * sizeof v);
  return out;
}

/// The ranks this process drives. Per-rank vectors of a bench (buffers, streams, communicators) hold this process's
/// ranks only; `firstRank` is the global rank of the first.
struct Launch {
  int nRanks = 0;
  int firstRank = 0;
  std::vector<int> devs;
  std::unique_ptr<mk::Bootstrap> boot;  ///< one process per rank only; unused by the communicator after create
  bool multiProcess() const { return boot != nullptr; }
  bool leader() const { return firstRank == 0; }
  /// The largest `v` over every process (the slowest rank's time); `v` itself in one process.
  double maxOverProcesses(double v) const {
    if (!boot) return v;
    for (double x : allGatherValue(*boot, v)) v = std::max(v, x);
    return v;
  }
  /// Rank 0's `v` on every process (a seed every process must share); `v` itself in one process.
  uint64_t fromLeader(uint64_t v) const { return boot ? allGatherValue(*boot, v).front() : v; }
  /// Every process here (a no-op in one process).
  void barrier() const {
    if (boot) boot->barrier();
  }
};

/// This process as one rank of a job started as one process per rank (mk::launchedAsRanks()): the rendezvous
/// (mk::bootstrapFromEnvironment, 20 s) and the GPU of its node rank.
Launch launchFromEnvironment();

/// One process driving ranks 0..devs.size()-1, rank i on devs[i].
Launch launchLocal(std::vector<int> devs);

/// The communicators of `l`'s ranks: Communicator::create over its bootstrap (one), or createLocal on its GPUs.
std::vector<mk::Communicator> createCommunicators(const Launch& l, const mk::CommConfig& cfg);

/// --transport's word as CommConfig::transport: "socket", "ibverbs", anything else Auto (the CLI checks the word).
mk::ProxyTransport proxyTransport(const std::string& name);

}  // namespace mkbench

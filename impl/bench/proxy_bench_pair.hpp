// mkernel — internal to mk-proxy-bench: two processes of this host for a measurement (a forked peer), their
// bootstrap, a plain TCP connection between them for the baseline probe, and what the records say about the host.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mk/bootstrap.hpp"
#include "mk/io/measurement.hpp"

namespace mk::bench {

/// A TCP port on 127.0.0.1 that was free a moment ago.
uint16_t freePort();
/// Bootstrap options of process `me` of two, meeting at 127.0.0.1:port.
TcpBootstrapOptions bootOptions(int me, uint16_t port);
/// Run `body` as process 0 (here, records into `records`) and process 1 (a forked child, records dropped), meeting at
/// a fresh port. Throws Error(IoError) when the child fails or does not finish within `timeoutS`, std::bad_alloc when
/// either process ran out of memory.
void runPair(const std::function<int(int me, uint16_t port, std::vector<MeasurementRecord>* records)>& body,
             std::vector<MeasurementRecord>* records, double timeoutS = 600);
/// A plain blocking TCP connection between the two processes of `boot` (process 1 listens, process 0 connects),
/// with TCP_NODELAY like the transport's. Collective.
int connectProbe(Bootstrap& boot);
/// The CPU's model name (/proc/cpuinfo), or "unknown".
std::string cpuModel();

}  // namespace mk::bench

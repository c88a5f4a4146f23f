// Generates and verifies a small all-reduce through the installed headers and libraries, and takes a command through
// the host side of the proxy FIFO (mk::host).
#include <chrono>
#include <cstdio>

#include "mk/algorithms/algorithms.hpp"
#include "mk/exec/verify.hpp"
#ifndef MK_CONSUMER_MODELS_ONLY
#include "mk/proxy/fifo.hpp"
#endif

int main() {
  mk::CollectiveSpec spec;
  spec.op = mk::CollOp::AllReduce;
  spec.algo = mk::Algorithm::Ring;
  spec.count = 1021;
  const mk::Schedule s = mk::generate(spec, {0, 0, 0, 0});
  const mk::VerifyResult v = mk::verifyCollective(s, spec, 7);
#ifdef MK_CONSUMER_MODELS_ONLY
  std::printf("consumer (models only): %s\n", v.ok ? "OK" : v.detail.c_str());
  return v.ok ? 0 : 1;
#else
  mk::proxy::HostFifo fifo(4);
  const mk::device::ProxyCommand cmd{mk::device::packProxyHeader(mk::device::ProxyKind::Flush, 1, 2, 3), 0};
  fifo.push(cmd, {0, 2, 3}, std::chrono::milliseconds(100));
  mk::proxy::FifoConsumer consumer = fifo.consumer();
  mk::proxy::PoppedCommand popped;
  const bool fifoOk = consumer.poll(&popped, 1) == 1 && mk::device::proxyStep(popped.command.header) == 3;
  std::printf("consumer: %s, fifo %s\n", v.ok ? "OK" : v.detail.c_str(), fifoOk ? "OK" : "broken");
  return v.ok && fifoOk ? 0 : 1;
#endif
}

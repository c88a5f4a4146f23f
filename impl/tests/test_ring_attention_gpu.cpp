// Ring attention on the GPU engine (Communicator::ringAttention; docs/attention.md, "Ring attention"): the attention
// engine as Attention steps of the resident kernel's compute lane, lse-merge on the GPU, the K / V blocks passed
// around the ring. 1 to 4 ranks sharing GPU 0 in one process (CommConfig::shareGpus: same-GPU puts), and ranks as
// nodes in separate processes under CUDA MPS (ProxyPuts through the FIFO, the proxy and the socket transport on
// loopback; those cases skip without MPS). Every output value and log-sum-exp of every rank is compared with
// attention over the whole sequence in double (mk/exec/ring_attention_data.hpp) from the same bf16 inputs, fresh
// random ones per case; odd chunk lengths, GQA and MQA, head dims 64 and 128, causal (zigzag) and not. Bad calls are
// refused before anything runs.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine_test_util.hpp"
#include "mk/communicator.hpp"
#include "mk/error.hpp"
#include "mk/exec/ring_attention_data.hpp"
#include "multiprocess_cases.hpp"

namespace {

using mk::RingAttentionSpec;

/// A float32 NaN: any output element the op fails to write fails the check.
constexpr uint32_t kSentinelBits = 0x7FC00001u;

RingAttentionSpec spec(uint32_t batch, uint32_t hq, uint32_t hkv, uint32_t d, uint64_t seq, bool causal) {
  RingAttentionSpec s;
  s.batch = batch;
  s.qHeads = hq;
  s.kvHeads = hkv;
  s.headDim = d;
  s.seq = seq;
  s.causal = causal;
  return s;
}

/// The GPU engine's tolerance (test_attention_gpu.cpp explains it): P enters P V rounded to bf16, so an output value
/// is good to 2^-9 x max |V| (every merge is a convex combination of such blocks); the log-sum-exp to ~1e-5 relative.
double gpuTolerance(double /*want*/, double lse, bool isLse) { return isLse ? 1e-4 * (1 + std::fabs(lse)) : 2.5e-3; }

uint64_t outCountOf(const RingAttentionSpec& s, uint32_t ranks) {
  return uint64_t{s.batch} * (s.seq / ranks) * s.qHeads * (s.headDim + 1);
}

/// One rank's device buffers of a ring attention: its pieces uploaded, out filled with the sentinel.
struct RankBuffers {
  void *q = nullptr, *kv = nullptr;
  float* out = nullptr;
  uint64_t outCount = 0;
  RankBuffers(const mk::RingAttentionData& d, uint32_t r, void* qp, void* kvp, void* outp)
      : q(qp), kv(kvp), out(static_cast<float*>(outp)), outCount(outCountOf(d.spec, d.nRanks)) {
    MK_CUDA_CHECK(cudaMemcpy(q, d.qBytes[r].data(), d.qBytes[r].size(), cudaMemcpyHostToDevice));
    MK_CUDA_CHECK(cudaMemcpy(kv, d.kvBytes[r].data(), d.kvBytes[r].size(), cudaMemcpyHostToDevice));
    const std::vector<uint32_t> sentinel(outCount, kSentinelBits);
    MK_CUDA_CHECK(cudaMemcpy(out, sentinel.data(), outCount * sizeof(float), cudaMemcpyHostToDevice));
  }
  /// Every element of this rank's out against the reference; returns the mismatches.
  uint64_t check(const mk::RingAttentionData& d, uint32_t r) const {
    std::vector<float> got(outCount);
    MK_CUDA_CHECK(cudaMemcpy(got.data(), out, outCount * sizeof(float), cudaMemcpyDeviceToHost));
    mk::VerifyResult res;
    res.ok = true;
    mk::checkRingAttentionRank(res, d, r, got.data(), gpuTolerance);
    CAPTURE(r);
    CHECK_MESSAGE(res.ok, res.detail);
    CHECK(res.checked == outCount);
    MESSAGE("rank " << r << ": " << res.checked << " values, worst error / tolerance " << res.worstRatio);
    return res.ok ? 0 : 1;
  }
};

mk::CommConfig localConfig(uint32_t ranks) {
  mk::CommConfig cfg;
  cfg.computeLanes = true;
  cfg.shareGpus = ranks > 1;
  cfg.pollBudgetMs = 5000;
  return cfg;
}

/// Run `s` on every rank of `comms` (one process, ranks sharing GPU 0) `repeats` times on the same buffers, checking
/// every rank after each run.
void runLocal(std::vector<mk::Communicator>& comms, const RingAttentionSpec& s, uint64_t seed, int repeats = 1) {
  const auto R = static_cast<uint32_t>(comms.size());
  CAPTURE(R);
  CAPTURE(s.headDim);
  CAPTURE(s.causal);
  CAPTURE(s.seq);
  const mk::RingAttentionData d = mk::makeRingAttentionData(s, R, seed);
  // Stream-ordered memory: freeing it does not wait for the resident kernels.
  std::vector<std::unique_ptr<mkt::DeviceBuffer>> mem;
  std::vector<std::unique_ptr<RankBuffers>> buf;
  for (uint32_t r = 0; r < R; ++r) {
    for (size_t bytes : {d.qBytes[r].size(), d.kvBytes[r].size(), outCountOf(s, R) * sizeof(float)})
      mem.push_back(std::make_unique<mkt::DeviceBuffer>(0, bytes));
    buf.push_back(std::make_unique<RankBuffers>(d, r, mem[3 * r]->get(), mem[3 * r + 1]->get(), mem[3 * r + 2]->get()));
  }
  mkt::Streams st(comms);
  for (int rep = 0; rep < repeats; ++rep) {
    {
      mkt::GroupGuard group;
      for (uint32_t r = 0; r < R; ++r) comms[r].ringAttention(s, buf[r]->q, buf[r]->kv, buf[r]->out, st.s[r]);
    }
    st.sync(comms);
    for (uint32_t r = 0; r < R; ++r) buf[r]->check(d, r);
  }
}

}  // namespace

TEST_CASE("ring attention gpu: one rank runs the attention engine and no merge") {
  auto comms = mk::Communicator::createLocal({0}, localConfig(1));
  uint64_t seed = std::random_device{}();
  runLocal(comms, spec(2, 4, 2, 128, 301, false), ++seed);
  runLocal(comms, spec(1, 8, 2, 64, 2 * 147, true), ++seed);
}

TEST_CASE("ring attention gpu: 2 to 4 ranks sharing GPU 0, causal and not, GQA and MQA, head dims 64 and 128") {
  uint64_t seed = std::random_device{}();
  for (uint32_t R : {2u, 3u, 4u}) {
    auto comms = mk::Communicator::createLocal(std::vector<int>(R, 0), localConfig(R));
    runLocal(comms, spec(2, 4, 2, 128, uint64_t{R} * 301, false), ++seed);
    runLocal(comms, spec(1, 8, 2, 64, uint64_t{R} * 2 * 147, true), ++seed);
    runLocal(comms, spec(2, 4, 1, 128, uint64_t{R} * 2 * 65, true), ++seed);
  }
}

TEST_CASE("ring attention gpu: repeated calls on the same buffers reuse the cached schedule and stay exact") {
  auto comms = mk::Communicator::createLocal({0, 0}, localConfig(2));
  runLocal(comms, spec(1, 16, 16, 128, 2 * 1024, true), std::random_device{}(), 3);
}

TEST_CASE("ring attention gpu: bad calls are refused before anything runs, naming the argument") {
  mkt::Buffer q(1 << 20), kv(1 << 20), out(1 << 22);  // before the communicators: freed after them
  auto comms = mk::Communicator::createLocal({0, 0}, localConfig(2));
  auto errorOf = [&](const RingAttentionSpec& s, const void* qp, const void* kvp, void* op) {
    try {
      comms[0].ringAttention(s, qp, kvp, static_cast<float*>(op), nullptr);
    } catch (const mk::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const RingAttentionSpec good = spec(1, 4, 2, 64, 256, true);
  const mk::RingAttentionPlan plan = comms[0].ringAttentionPlan(good);  // what the call runs: 8 : 1 weights
  CHECK(plan.spec.computeCtas == 8);
  CHECK(plan.workerCtas == comms[0].workerCtas());
  CHECK(plan.computeCtas >= 1);
  CHECK(plan.sendCtas >= 1);
  CHECK(plan.computeCtas + plan.sendCtas <= plan.workerCtas);
  CHECK(plan.computeCtas > plan.sendCtas);
  std::string msg = errorOf(spec(1, 4, 2, 32, 256, true), q.p, kv.p, out.p);
  CHECK(msg.find("headDim 32 is not supported by the GPU attention engine") != std::string::npos);
  RingAttentionSpec f16 = good;
  f16.dtype = mk::DType::Float16;
  CHECK(errorOf(f16, q.p, kv.p, out.p).find("reads bf16 Q, K and V only") != std::string::npos);
  msg = errorOf(spec(1, 4, 2, 64, 254, true), q.p, kv.p, out.p);  // 254 is no multiple of 2 x 2 ranks
  CHECK(msg.find("seq") != std::string::npos);
  msg = errorOf(spec(1, 6, 4, 64, 256, false), q.p, kv.p, out.p);
  CHECK(msg.find("qHeads") != std::string::npos);
  CHECK(errorOf(good, nullptr, kv.p, out.p).find("ringAttention: q is null") != std::string::npos);
  CHECK(errorOf(good, q.c() + 8, kv.p, out.p).find("ringAttention: q ") != std::string::npos);
}

// Its own case: a second communicator's resident kernel cannot start while the compute-lane kernels above hold every
// SM of the GPU (its roll call would time out).
TEST_CASE("ring attention gpu: a communicator without compute lanes refuses ring attention") {
  mkt::Buffer q(1 << 20), kv(1 << 20), out(1 << 22);
  auto plain = mk::Communicator::createLocal({0}, mk::CommConfig{});
  try {
    plain[0].ringAttention(spec(1, 4, 2, 64, 256, true), q.p, kv.p, static_cast<float*>(out.p), nullptr);
    FAIL("a communicator without compute lanes ran ring attention");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::Unsupported);
    CHECK(std::string(e.what()).find("CommConfig::computeLanes") != std::string::npos);
  }
}

namespace {

constexpr double kChildTimeoutS = 170;

/// This process's rank of a communicator of `ranks` ranks in `ranksPerNode`-rank nodes sharing GPU 0: ring attention
/// whose blocks cross nodes through the proxy, checked on this rank (twice: the second call reuses the schedule).
void acrossNodes(uint32_t ranksPerNode, uint32_t ranks) {
  mkt::useLocalDevice();
  const RingAttentionSpec specs[2] = {spec(2, 4, 2, 128, uint64_t{ranks} * 301, false),
                                      spec(1, 8, 2, 64, uint64_t{ranks} * 2 * 147, true)};
  // Every process derives the same data from the same seed and keeps its rank's pieces; the memory comes before the
  // communicator (cudaMalloc, exportable), so that it is freed after it.
  size_t bytes = 0;
  for (const RingAttentionSpec& s : specs) bytes = std::max<size_t>(bytes, outCountOf(s, ranks) * sizeof(float));
  mkt::Buffer q(bytes), kv(bytes), out(bytes);
  mk::CommConfig cfg = mkt::sharedGpuNodesConfig(ranksPerNode, 5000, 30000);
  cfg.computeLanes = true;
  mkt::Env env(cfg);
  REQUIRE(static_cast<uint32_t>(env.comm.size()) == ranks);
  REQUIRE(env.comm.topology().nodes == ranks / ranksPerNode);
  const auto r = static_cast<uint32_t>(env.comm.rank());
  for (const RingAttentionSpec& s : specs) {
    const mk::RingAttentionData d = mk::makeRingAttentionData(s, ranks, 42 + s.seq);
    RankBuffers buf(d, r, q.p, kv.p, out.p);
    for (int rep = 0; rep < 2; ++rep) {
      env.comm.ringAttention(s, buf.q, buf.kv, buf.out, env.stream);
      env.comm.synchronize();
      CHECK(buf.check(d, r) == 0);
    }
  }
}

bool launch(const char* name, int ranks) { return mkt::launchOnSharedGpu(name, ranks, kChildTimeoutS); }

}  // namespace

TEST_CASE("ring attention gpu: 2 nodes of 1 rank pass the blocks through the proxy") {
  if (!launch("ring attention gpu: 2 nodes of 1 rank pass the blocks through the proxy", 2)) acrossNodes(1, 2);
}

TEST_CASE("ring attention gpu: 2 nodes of 2 ranks mix same-node puts and the proxy") {
  if (!launch("ring attention gpu: 2 nodes of 2 ranks mix same-node puts and the proxy", 4)) acrossNodes(2, 4);
}

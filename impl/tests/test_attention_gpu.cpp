// GPU tests of the attention forward engine (mk/attention.hpp): fresh random bf16 inputs, odd sequence lengths,
// causal with position offsets (rows that see no key included), GQA and MQA, head dims 64 and 128, strided batches;
// every output value and log-sum-exp against the CPU executor's attention step (double, the same bf16 inputs).
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "mk/attention.hpp"
#include "mk/cuda_check.hpp"
#include "mk/exec/executor.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/schedule.hpp"

using namespace mk;

namespace {

struct Case {
  uint32_t d, hq, hkv, batch, sq, skv;
  bool causal;
  uint64_t qPos, kvPos;
  uint32_t ctas;  // 0: one per SM
};

/// Host reference: the `attention` step of a one-rank schedule run by the CPU executor (buffers q, kv, out).
struct Reference {
  Schedule s;
  HostMemory mem;
};

Reference reference(const AttentionShape& sh, uint32_t seed) {
  Reference r;
  Schedule& s = r.s;
  s.nRanks = 1;
  s.nodeOf = {0};
  const uint64_t qCount = uint64_t{sh.batch} * sh.ldq * sh.qHeads * sh.headDim;
  const uint64_t kvCount = sh.vOffset + uint64_t{sh.batch} * sh.ldkv * sh.kvHeads * sh.headDim;
  const uint64_t outCount = uint64_t{sh.batch} * sh.ldo * sh.qHeads * sh.outRow();
  s.buffers = {{"q", DType::BFloat16, BufferKind::Input, {qCount}},
               {"kv", DType::BFloat16, BufferKind::Input, {kvCount}},
               {"out", DType::Float32, BufferKind::Output, {outCount}}};
  s.attentions = {sh};
  s.lanes.resize(1);
  Step st;
  st.kind = StepKind::Attention;
  st.aux = 0;
  st.dst = bufRef(0, 2, 0);
  st.a = bufRef(0, 0, 0);
  st.b = bufRef(0, 1, 0);
  s.lanes[0].push_back(Lane{LaneRole::Compute, 1, {st}});
  fillCostAttributes(s);
  r.mem = HostMemory::allocate(s);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (uint16_t b = 0; b < 2; ++b)
    for (uint64_t i = 0; i < s.buffers[b].count[0]; ++i)
      storeElement(DType::BFloat16, r.mem.bytes[0][b].data(), i, u(rng));
  execute(s, r.mem);
  return r;
}

void check(const AttentionShape& sh, const Case& c, const Reference& ref, uint32_t* counter, bool dynamic);

void runCase(const Case& c, uint32_t seed) {
  AttentionShape sh;
  sh.batch = c.batch;
  sh.qHeads = c.hq;
  sh.kvHeads = c.hkv;
  sh.headDim = c.d;
  sh.sq = c.sq;
  sh.skv = c.skv;
  sh.ldq = c.sq + (c.batch > 1 ? 3 : 0);  // batches are slices of longer sequences
  sh.ldkv = c.skv + (c.batch > 1 ? 5 : 0);
  sh.ldo = c.sq + (c.batch > 1 ? 2 : 0);
  sh.causal = c.causal;
  sh.qPos = c.qPos;
  sh.kvPos = c.kvPos;
  sh.scale = defaultAttentionScale(c.d);
  sh.vOffset = uint64_t{sh.batch} * sh.ldkv * sh.kvHeads * sh.headDim + 8;  // a gap between K and V
  INFO("d " << c.d << " hq " << c.hq << " hkv " << c.hkv << " B " << c.batch << " sq " << c.sq << " skv " << c.skv
            << " causal " << c.causal << " qPos " << c.qPos << " kvPos " << c.kvPos << " ctas " << c.ctas);
  Reference ref = reference(sh, seed);
  uint32_t* counter = nullptr;  // dynamic unit fetch; every run must leave it zero for the next
  MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&counter), sizeof(uint32_t)));
  MK_CUDA_CHECK(cudaMemset(counter, 0, sizeof(uint32_t)));
  for (int mode = 0; mode < 3; ++mode) {  // our counter, attentionForward's own, a static split
    check(sh, c, ref, mode == 0 ? counter : nullptr, mode < 2);
    uint32_t left = 1;
    MK_CUDA_CHECK(cudaMemcpy(&left, counter, sizeof(uint32_t), cudaMemcpyDeviceToHost));
    CHECK(left == 0);
  }
  cudaFree(counter);
}

/// Run the engine on the reference's inputs and compare every output value and log-sum-exp.
void check(const AttentionShape& sh, const Case& c, const Reference& ref, uint32_t* counter, bool dynamic) {
  const char* name = !dynamic ? "static" : counter ? "dynamic-given" : "dynamic";
  INFO("units " << name);
  const auto& q = ref.mem.bytes[0][0];
  const auto& kv = ref.mem.bytes[0][1];
  const uint64_t outCount = ref.s.buffers[2].count[0];
  void *dq = nullptr, *dkv = nullptr;
  float* dout = nullptr;
  MK_CUDA_CHECK(cudaMalloc(&dq, q.size()));
  MK_CUDA_CHECK(cudaMalloc(&dkv, kv.size()));
  MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dout), outCount * sizeof(float)));
  MK_CUDA_CHECK(cudaMemcpy(dq, q.data(), q.size(), cudaMemcpyHostToDevice));
  MK_CUDA_CHECK(cudaMemcpy(dkv, kv.data(), kv.size(), cudaMemcpyHostToDevice));
  const float sentinel = 7.0f;  // rows between the batches' blocks stay untouched
  std::vector<float> got(outCount, sentinel);
  MK_CUDA_CHECK(cudaMemcpy(dout, got.data(), outCount * sizeof(float), cudaMemcpyHostToDevice));
  AttentionOptions opt;
  opt.ctas = c.ctas;
  opt.dynamicUnits = dynamic;
  opt.unitCounter = counter;
  uint32_t* report = nullptr;  // who waited for what, should a device wait time out
  MK_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&report), 8 * sizeof(uint32_t), cudaHostAllocMapped));
  std::fill(report, report + 8, 0u);
  opt.timeoutReport = report;
  attentionForward(sh, DType::BFloat16, dq, dkv, dout, nullptr, opt);
  const cudaError_t done = cudaDeviceSynchronize();
  if (report[0] == 2)
    std::printf("attention %s: a wait timed out: CTA %u thread %u role %u stage %u parity %u unit %u\n", name,
                report[1], report[2], report[3], report[4], report[5], report[6]);
  cudaFreeHost(report);
  MK_CUDA_CHECK(done);
  MK_CUDA_CHECK(cudaMemcpy(got.data(), dout, outCount * sizeof(float), cudaMemcpyDeviceToHost));
  cudaFree(dq);
  cudaFree(dkv);
  cudaFree(dout);

  // Tolerance: O is a convex combination of V values in [-1, 1]; P enters P V rounded to bf16 (relative error
  // <= 2^-9 per weight) while the normaliser sums the fp32 weights, so |O - ref| <= 2^-9 x max |V| (~2e-3); S is
  // exact bf16 products summed in fp32 and exp2 is the SFU's (~2 ulp): the log-sum-exp is good to ~1e-5 relative.
  const double tolO = 2.5e-3;
  uint64_t bad = 0, empty = 0, rows = 0;
  double worstO = 0, worstL = 0;
  const uint64_t row = sh.outRow();
  for (uint64_t b = 0; b < sh.batch; ++b)
    for (uint64_t i = 0; i < sh.ldo; ++i)
      for (uint64_t h = 0; h < sh.qHeads; ++h) {
        const uint64_t at = ((b * sh.ldo + i) * sh.qHeads + h) * row;
        if (i >= sh.sq) {
          for (uint64_t k = 0; k < row; ++k) bad += got[at + k] != sentinel;
          continue;
        }
        ++rows;
        const float refL = loadElement(DType::Float32, ref.mem.bytes[0][2].data(), at + sh.headDim);
        if (std::isinf(refL)) {
          ++empty;
          bad += !(std::isinf(got[at + sh.headDim]) && got[at + sh.headDim] < 0);
          for (uint64_t k = 0; k < sh.headDim; ++k) bad += got[at + k] != 0.0f;
          continue;
        }
        for (uint64_t k = 0; k < sh.headDim; ++k) {
          const double e = std::fabs(got[at + k] - loadElement(DType::Float32, ref.mem.bytes[0][2].data(), at + k));
          worstO = std::max(worstO, std::isfinite(e) ? e : 1e30);
          bad += !(e <= tolO);
        }
        const double eL = std::fabs(double{got[at + sh.headDim]} - refL);
        worstL = std::max(worstL, std::isfinite(eL) ? eL : 1e30);
        bad += !(eL <= 1e-4 * (1.0 + std::fabs(refL)));
      }
  std::printf(
      "attention %s d%u hq%u/%u B%u sq%u skv%u causal%d pos %llu/%llu: %llu rows (%llu see no key), max |dO| "
      "%.3g, max |dLSE| %.3g, %llu bad\n",
      name, c.d, c.hq, c.hkv, c.batch, c.sq, c.skv, c.causal ? 1 : 0, static_cast<unsigned long long>(c.qPos),
      static_cast<unsigned long long>(c.kvPos), static_cast<unsigned long long>(rows),
      static_cast<unsigned long long>(empty), worstO, worstL, static_cast<unsigned long long>(bad));
  CHECK(bad == 0);
  CHECK(rows == uint64_t{sh.batch} * sh.sq * sh.qHeads);
}

}  // namespace

TEST_CASE("attention gpu: non-causal, GQA and MQA, head dims 64 and 128, strided batches, odd lengths") {
  uint32_t seed = std::random_device{}();
  runCase({128, 8, 2, 2, 129, 300, false, 0, 0, 0}, ++seed);
  runCase({64, 4, 1, 2, 63, 77, false, 0, 0, 0}, ++seed);
  runCase({64, 2, 2, 1, 1, 1, false, 0, 0, 0}, ++seed);
  runCase({128, 1, 1, 1, 1, 2049, false, 0, 0, 0}, ++seed);
  runCase({64, 2, 1, 1, 1000, 2049, false, 0, 0, 0}, ++seed);
}

TEST_CASE("attention gpu: causal with position offsets, rows and whole tiles that see no key") {
  uint32_t seed = std::random_device{}();
  runCase({64, 4, 1, 2, 63, 77, true, 0, 0, 0}, ++seed);          // row i sees keys 0..i
  runCase({128, 2, 2, 2, 129, 300, true, 100, 130, 0}, ++seed);   // rows 0..29 see no key
  runCase({64, 8, 2, 2, 300, 77, true, 0, 200, 0}, ++seed);       // query tile 0 sees nothing at all
  runCase({128, 2, 1, 1, 1000, 2049, true, 1049, 0, 0}, ++seed);  // the last query sees every key
  runCase({128, 1, 1, 1, 1, 2049, true, 5000, 0, 0}, ++seed);
}

TEST_CASE("attention gpu: a few CTAs walk many units (the stage ring and Q buffer wrap across units)") {
  uint32_t seed = std::random_device{}();
  runCase({128, 8, 2, 2, 300, 300, true, 0, 0, 3}, ++seed);
  runCase({64, 4, 2, 2, 257, 1000, false, 0, 0, 2}, ++seed);
}

// Tests of concurrent copies of a schedule: the result validates, computes what each copy computes, and takes
// the time one copy takes when the copies share no link.
#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/exec/executor.hpp"
#include "mk/plan/embed.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/sim/replay.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;
using namespace mk::plan;

TEST_CASE("embed: copies of an all-reduce on interleaved ranks validate and each reduces its own inputs") {
  CollectiveSpec spec;
  spec.op = CollOp::AllReduce;
  spec.algo = Algorithm::Hierarchical;
  spec.dtype = DType::Float32;
  spec.count = 1003;  // odd: uneven pieces
  const std::vector<uint32_t> partNodes = {0, 0, 1, 1, 2, 2};
  GenOptions gen;
  gen.chunks = 2;
  const Schedule part = generate(spec, partNodes, gen);
  // Three copies on 3 nodes x 6 GPUs: copy c takes local GPUs {2c, 2c+1} of every node.
  std::vector<std::vector<uint32_t>> maps(3);
  std::vector<uint32_t> nodeOf(18);
  for (uint32_t r = 0; r < 18; ++r) nodeOf[r] = r / 6;
  for (uint32_t c = 0; c < 3; ++c)
    for (uint32_t j = 0; j < 6; ++j) maps[c].push_back((j / 2) * 6 + 2 * c + j % 2);
  const Schedule all = embedConcurrent(part, maps, nodeOf);
  CHECK(all.nRanks == 18);
  CHECK(all.stepCount() == 3 * part.stepCount());
  CHECK_NOTHROW(validate(all));

  HostMemory mem = HostMemory::allocate(all);
  const int in = all.bufferIndex("input"), out = all.bufferIndex("output");
  REQUIRE(in >= 0);
  REQUIRE(out >= 0);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(-8, 8);
  std::vector<std::vector<float>> inputs(18, std::vector<float>(spec.count));
  for (uint32_t r = 0; r < 18; ++r)
    for (uint64_t i = 0; i < spec.count; ++i) {
      inputs[r][i] = static_cast<float>(small(rng));
      mem.as<float>(r, static_cast<uint16_t>(in))[i] = inputs[r][i];
    }
  execute(all, mem);
  for (uint32_t c = 0; c < 3; ++c)
    for (uint64_t i = 0; i < spec.count; ++i) {
      float sum = 0;
      for (uint32_t r : maps[c]) sum += inputs[r][i];
      for (uint32_t r : maps[c]) REQUIRE(mem.as<float>(r, static_cast<uint16_t>(out))[i] == sum);
    }
}

TEST_CASE("embed: copies on their own rails take the time of one copy, sharing a NIC slows them") {
  CollectiveSpec spec;
  spec.op = CollOp::AllReduce;
  spec.algo = Algorithm::Ring;
  spec.dtype = DType::BFloat16;
  spec.count = 8 << 20;
  const std::vector<uint32_t> partNodes = {0, 1, 2, 3};  // one rank per node
  const Schedule part = generate(spec, partNodes, {});
  Topology topo = topologyPreset("dgx-h100", 4);
  topo.node.gpus = 2;
  topo.node.nics = 2;
  const Profile p = defaultProfile(topo);
  std::vector<uint32_t> one(4), nodeOf2(8);
  Topology single = topo;
  single.node.gpus = 1;
  single.node.nics = 1;
  for (uint32_t r = 0; r < 8; ++r) nodeOf2[r] = r / 2;
  std::vector<std::vector<uint32_t>> maps = {{0, 2, 4, 6}, {1, 3, 5, 7}};
  sim::SimOptions so;
  so.trace = false;
  so.linkLoad = false;
  const double alone = sim::predict(part, single, p, so).totalUs;
  const double both = sim::predict(embedConcurrent(part, maps, nodeOf2), topo, p, so).totalUs;
  CHECK(both == doctest::Approx(alone).epsilon(1e-9));
  Topology shared = topo;
  shared.node.nics = 1;
  const double sharedUs = sim::predict(embedConcurrent(part, maps, nodeOf2), shared, p, so).totalUs;
  CHECK(sharedUs > 1.5 * alone);
}

TEST_CASE("embed: maps that do not partition the ranks are refused") {
  CollectiveSpec spec;
  spec.op = CollOp::AllGather;
  spec.algo = Algorithm::Ring;
  spec.count = 16;
  const Schedule part = generate(spec, {0, 0}, {});
  CHECK_THROWS_AS(embedConcurrent(part, {{0, 1}, {1, 2}}, {0, 0, 0, 0}), Error);  // rank 1 twice
  CHECK_THROWS_AS(embedConcurrent(part, {{0, 1}}, {0, 0, 0}), Error);             // rank 2 in no copy
  CHECK_THROWS_AS(embedConcurrent(part, {{0, 1, 2}}, {0, 0, 0}), Error);          // wrong size
}

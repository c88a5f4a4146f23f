// Several ranks on one GPU (CommConfig::shareGpus): each rank's resident kernel holds its share of the SMs, and
// every generator's schedule runs between them exactly as between GPUs (the "peer" is the same device).
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "engine_test_util.hpp"

namespace {

/// Every generator of every collective, a few counts, on `ranks` ranks of GPU 0.
void everyGenerator(uint32_t ranks) {
  mk::CommConfig cfg;
  cfg.shareGpus = true;
  auto comms = mk::Communicator::createLocal(std::vector<int>(ranks, 0), cfg);
  CHECK(comms[0].workerCtas() >= 1);
  uint64_t seed = 100 * ranks;
  for (mk::CollOp op : {mk::CollOp::AllReduce, mk::CollOp::AllGather, mk::CollOp::ReduceScatter, mk::CollOp::Broadcast,
                        mk::CollOp::AllToAll})
    for (mk::Algorithm algo : mk::algorithmsFor(op))
      for (uint64_t count : {1ull, 1021ull, (1ull << 18) + 3}) {
        mk::CollectiveSpec spec;
        spec.op = op;
        spec.count = count;
        spec.dtype = count == 1021 ? mk::DType::BFloat16 : mk::DType::Float32;
        spec.root = op == mk::CollOp::Broadcast ? ranks - 1 : 0;
        CAPTURE(mk::toString(op));
        CAPTURE(mk::toString(algo));
        CAPTURE(count);
        CHECK(mkt::runAndCheck(comms, spec, false, seed++, true, mk::CollOptions(algo)) == 0);
      }
}

}  // namespace

TEST_CASE("shared gpu: two ranks on one GPU run every generator exactly") { everyGenerator(2); }

TEST_CASE("shared gpu: four ranks on one GPU run every generator exactly") { everyGenerator(4); }

TEST_CASE("shared gpu: a GPU listed twice is refused unless shareGpus is set") {
  const std::string msg = mkt::errorOf([] { mk::Communicator::createLocal({0, 0}); });
  CHECK(msg.find("listed twice") != std::string::npos);
  CHECK(msg.find("shareGpus") != std::string::npos);
}

TEST_CASE("shared gpu: ranks whose grids do not fit on the GPU together are refused naming the share") {
  mk::CommConfig cfg;
  cfg.shareGpus = true;
  cfg.workerCtas = 400;  // 4 x 401 CTAs of 512 threads: more than an H100 / H200 holds at once
  const std::string msg = mkt::errorOf([&] { mk::Communicator::createLocal({0, 0, 0, 0}, cfg); });
  CHECK(msg.find("4 ranks share this GPU") != std::string::npos);
  CHECK(msg.find("co-resident") != std::string::npos);
}

TEST_CASE("shared gpu: LL packets are exact back to back, odd sizes, every dtype, every packet generator") {
  // Packets reuse their area every second op (the epoch tells old from new), so each size runs several ops in a row.
  const std::pair<mk::CollOp, mk::Algorithm> gens[] = {{mk::CollOp::AllReduce, mk::Algorithm::OneShot},
                                                       {mk::CollOp::AllReduce, mk::Algorithm::TwoShot},
                                                       {mk::CollOp::AllGather, mk::Algorithm::Direct}};
  for (uint32_t ranks : {2u, 4u}) {
    mk::CommConfig cfg;
    cfg.shareGpus = true;
    auto comms = mk::Communicator::createLocal(std::vector<int>(ranks, 0), cfg);
    uint64_t seed = 7000 + ranks;
    for (const auto& [op, algo] : gens)
      for (mk::DType dt : {mk::DType::Float32, mk::DType::BFloat16, mk::DType::Float16})
        for (uint64_t count : {1ull, 3ull, 1021ull, 4099ull, 16389ull})
          for (uint32_t chunks : {1u, 3u}) {
            mk::CollOptions opt(algo);
            opt.protocol = mk::Protocol::LL;
            opt.chunks = chunks;
            mk::CollectiveSpec spec;
            spec.op = op;
            spec.count = count;
            spec.dtype = dt;
            CAPTURE(ranks);
            CAPTURE(mk::toString(op));
            CAPTURE(mk::toString(algo));
            CAPTURE(mk::toString(dt));
            CAPTURE(count);
            CAPTURE(chunks);
            for (int rep = 0; rep < 3; ++rep) CHECK(mkt::runAndCheck(comms, spec, rep == 1, seed++, false, opt) == 0);
          }
  }
}

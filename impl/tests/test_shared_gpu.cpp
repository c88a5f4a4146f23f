// Several ranks on one GPU (CommConfig::shareGpus): each rank's resident kernel holds its share of the SMs, and
// every generator's schedule runs between them exactly as between GPUs (the "peer" is the same device); schedules
// with runtime extents run there against the CPU executor.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine_test_util.hpp"
#include "mk/exec/executor.hpp"
#include "mk/schedule/pack.hpp"

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

// ---- runtime extents (docs/gpu-engine.md, "Runtime extents") ----------------------------------------------------

namespace {

/// The dispatch half of a mixture-of-experts layer (models/tests/test_extent.cpp's MoeDispatchGemm without the
/// GEMM): R ranks of E experts each; rank r sends to expert j = d * E + e of rank d the first to<j> of its `bound`
/// token rows (x, block j), into block (r * E + e) of d's recv (an Output, so every element can be compared). A Put
/// per remote expert signals flag r of rank d, also when it moves nothing; each rank's second lane waits for every
/// sender's E signals.
struct ExtentDispatch {
  uint32_t R = 3, E = 2, bound = 48, hidden = 136;
  mk::Schedule s;

  ExtentDispatch() {
    s.nRanks = R;
    s.nodeOf.assign(R, 0);
    s.nFlags = R;
    const uint64_t all = uint64_t{R} * E * bound * hidden;
    s.buffers = {{"x", mk::DType::Float32, mk::BufferKind::Input, std::vector<uint64_t>(R, all)},
                 {"recv", mk::DType::Float32, mk::BufferKind::Output, std::vector<uint64_t>(R, all)}};
    for (uint32_t j = 0; j < R * E; ++j) s.extents.push_back({"to" + std::to_string(j), bound, bound / 2.0});
    s.lanes.resize(R);
    for (uint32_t r = 0; r < R; ++r) {
      mk::Lane send, waits;
      for (uint32_t d = 0; d < R; ++d)
        for (uint32_t e = 0; e < E; ++e) {
          mk::Step st;
          st.kind = d == r ? mk::StepKind::Copy : mk::StepKind::Put;
          st.count = uint64_t{bound} * hidden;
          st.extent = d * E + e;
          st.dst = mk::bufRef(d, 1, (uint64_t{r} * E + e) * bound * hidden);
          st.a = mk::bufRef(r, 0, uint64_t{d * E + e} * bound * hidden);
          if (d != r) {
            st.flags = mk::kStepSignal;
            st.flag = mk::FlagRef{d, r};
            st.value = 1;
          }
          send.steps.push_back(st);
        }
      for (uint32_t src = 0; src < R; ++src) {
        if (src == r) continue;
        mk::Step w;
        w.kind = mk::StepKind::Wait;
        w.flag = mk::FlagRef{r, src};
        w.value = E;
        waits.steps.push_back(w);
      }
      s.lanes[r] = {send, waits};
    }
    mk::fillCostAttributes(s);
  }
};

/// Run `f` on `comms` with words[r] = this rank's values, compare every recv element with the CPU executor's result
/// for the same values; returns the mismatches.
uint64_t runExtentDispatch(std::vector<mk::Communicator>& comms, const ExtentDispatch& f, const mk::ExtentValues& v,
                           uint64_t seed) {
  mk::HostMemory mem = mk::HostMemory::allocate(f.s);
  const uint64_t all = f.s.buffers[0].count[0];
  std::vector<std::unique_ptr<mkt::DeviceBuffer>> x, recv, words;
  mkt::Streams streams(comms);
  for (uint32_t r = 0; r < f.R; ++r) {
    const std::vector<uint8_t> in =
        mkt::toBytes(mk::DType::Float32, mkt::randomValues(mk::DType::Float32, all, seed + r, false));
    std::memcpy(mem.bytes[r][0].data(), in.data(), in.size());
    x.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), in.size()));
    x.back()->upload(in.data(), in.size());
    recv.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), in.size()));
    recv.back()->fill(0);
    words.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), v[r].size() * sizeof(uint64_t)));
  }
  for (uint32_t r = 0; r < f.R; ++r) {
    // Stream-ordered: the words are written on the op's stream right before it.
    MK_CUDA_CHECK(cudaSetDevice(comms[r].device()));
    MK_CUDA_CHECK(cudaMemcpyAsync(words[r]->get(), v[r].data(), v[r].size() * sizeof(uint64_t), cudaMemcpyHostToDevice,
                                  streams.s[r]));
    comms[r].execute(f.s, {x[r]->get()}, {recv[r]->get()}, streams.s[r],
                     reinterpret_cast<const uint64_t*>(words[r]->get()));
  }
  for (auto& c : comms) c.synchronize();
  streams.sync(comms);
  mk::ExecOptions opt;
  opt.extents = v;
  mk::execute(f.s, mem, opt);
  uint64_t bad = 0;
  for (uint32_t r = 0; r < f.R; ++r) {
    std::vector<float> got(all);
    recv[r]->download(got.data(), all * sizeof(float));
    const float* want = mem.as<float>(r, 1);
    for (uint64_t i = 0; i < all; ++i)
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && ++bad <= 3)
        CHECK_MESSAGE(false, "rank " << r << " element " << i << ": " << got[i] << " != " << want[i]);
  }
  return bad;
}

}  // namespace

TEST_CASE("shared gpu: puts sized by runtime extents match the CPU executor, twice on one cached program") {
  mk::CommConfig cfg;
  cfg.shareGpus = true;
  cfg.minBytesPerCta = 4096;  // several CTAs per put: pieces of the runtime count
  const ExtentDispatch f;
  auto comms = mk::Communicator::createLocal(std::vector<int>(f.R, 0), cfg);
  std::mt19937_64 rng(36);
  mk::ExtentValues random(f.R, std::vector<uint64_t>(f.R * f.E));
  for (auto& row : random)
    for (auto& t : row) t = rng() % (f.bound + 1);
  // Skewed: every rank sends nothing to expert 1, everything to expert 0, one token to the rest.
  mk::ExtentValues skewed(f.R, std::vector<uint64_t>(f.R * f.E, 1));
  for (auto& row : skewed) {
    row[0] = f.bound;
    row[1] = 0;
  }
  CHECK(runExtentDispatch(comms, f, random, 1) == 0);
  CHECK(runExtentDispatch(comms, f, skewed, 2) == 0);
  const mk::ExtentValues bound(f.R, std::vector<uint64_t>(f.R * f.E, f.bound));
  CHECK(runExtentDispatch(comms, f, bound, 3) == 0);
}

TEST_CASE("shared gpu: an extent value above its bound fails the op naming the extent and the rank") {
  mk::CommConfig cfg;
  cfg.shareGpus = true;
  const ExtentDispatch f;
  auto comms = mk::Communicator::createLocal(std::vector<int>(f.R, 0), cfg);
  mk::ExtentValues v(f.R, std::vector<uint64_t>(f.R * f.E, 1));
  v[1][3] = f.bound + 1;
  const std::string msg = mkt::errorOf([&] { runExtentDispatch(comms, f, v, 4); });
  CAPTURE(msg);
  CHECK(msg.find("extent 'to3' is 49 on rank 1, its bound is 48") != std::string::npos);
  CHECK(msg.find("rank 1 lane 0") != std::string::npos);
}

TEST_CASE("shared gpu: extent words for a schedule without extents are refused before anything runs") {
  mk::CommConfig cfg;
  cfg.shareGpus = true;
  ExtentDispatch f;
  f.s.extents.clear();
  for (auto& lanes : f.s.lanes)
    for (auto& st : lanes[0].steps) st.extent = mk::kNoExtent;
  auto comms = mk::Communicator::createLocal(std::vector<int>(f.R, 0), cfg);
  mkt::DeviceBuffer buf(comms[0].device(), 1024);
  const std::string msg = mkt::errorOf([&] {
    comms[0].execute(f.s, {buf.get()}, {buf.get() + 512}, nullptr, reinterpret_cast<const uint64_t*>(buf.get()));
  });
  CHECK(msg.find("declares no runtime extents") != std::string::npos);
}

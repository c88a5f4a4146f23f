// Every collective x dtype x redop x count on 2 GPUs through the resident kernel, against the CPU reference.
#include <doctest/doctest.h>

#include "engine_test_util.hpp"

namespace {

using mk::CollOp;
using mk::DType;
using mk::RedOp;

bool hasRedOp(CollOp op) { return op == CollOp::AllReduce || op == CollOp::ReduceScatter; }

/// Counts {1, odd, 1 MiB + 3} x redops x {out of place, in place}; inputs are small integers, so every
/// result is exact and compared bit for bit.
void sweep(CollOp op, DType dt) {
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2));
  uint64_t seed = 1 + static_cast<uint64_t>(op) * 100 + static_cast<uint64_t>(dt) * 10;
  for (RedOp red : {RedOp::Sum, RedOp::Max, RedOp::Min}) {
    if (!hasRedOp(op) && red != RedOp::Sum) continue;
    for (uint64_t count : {1ull, 1021ull, (1ull << 20) + 3})
      for (bool inPlace : {false, true}) {
        mk::CollectiveSpec spec;
        spec.op = op;
        spec.dtype = dt;
        spec.redop = red;
        spec.count = count;
        spec.root = op == CollOp::Broadcast ? 1 : 0;
        CAPTURE(mk::toString(op));
        CAPTURE(mk::toString(dt));
        CAPTURE(mk::toString(red));
        CAPTURE(count);
        CAPTURE(inPlace);
        CAPTURE(mk::toString(comms[0].chooseAlgorithm(op, count, dt)));
        CAPTURE(seed);
        CHECK(mkt::runAndCheck(comms, spec, inPlace, seed++) == 0);
      }
  }
}

/// One large op (the largest buffer is 256 MiB), float32.
void large(CollOp op) {
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2));
  mk::CollectiveSpec spec;
  spec.op = op;
  spec.dtype = DType::Float32;
  spec.count = op == CollOp::AllReduce || op == CollOp::Broadcast ? (64ull << 20) : (32ull << 20);
  CAPTURE(mk::toString(comms[0].chooseAlgorithm(op, spec.count, spec.dtype)));
  CHECK(mkt::runAndCheck(comms, spec, false, 77) == 0);
}

}  // namespace

TEST_CASE("engine: allreduce float32 matches the reference on 2 GPUs") { sweep(CollOp::AllReduce, DType::Float32); }
TEST_CASE("engine: allreduce bfloat16 matches the reference on 2 GPUs") { sweep(CollOp::AllReduce, DType::BFloat16); }
TEST_CASE("engine: allreduce float16 matches the reference on 2 GPUs") { sweep(CollOp::AllReduce, DType::Float16); }
TEST_CASE("engine: allgather float32 matches the reference on 2 GPUs") { sweep(CollOp::AllGather, DType::Float32); }
TEST_CASE("engine: allgather bfloat16 matches the reference on 2 GPUs") { sweep(CollOp::AllGather, DType::BFloat16); }
TEST_CASE("engine: allgather float16 matches the reference on 2 GPUs") { sweep(CollOp::AllGather, DType::Float16); }
TEST_CASE("engine: reducescatter float32 matches the reference on 2 GPUs") {
  sweep(CollOp::ReduceScatter, DType::Float32);
}
TEST_CASE("engine: reducescatter bfloat16 matches the reference on 2 GPUs") {
  sweep(CollOp::ReduceScatter, DType::BFloat16);
}
TEST_CASE("engine: reducescatter float16 matches the reference on 2 GPUs") {
  sweep(CollOp::ReduceScatter, DType::Float16);
}
TEST_CASE("engine: broadcast float32 matches the reference on 2 GPUs") { sweep(CollOp::Broadcast, DType::Float32); }
TEST_CASE("engine: broadcast bfloat16 matches the reference on 2 GPUs") { sweep(CollOp::Broadcast, DType::BFloat16); }
TEST_CASE("engine: broadcast float16 matches the reference on 2 GPUs") { sweep(CollOp::Broadcast, DType::Float16); }
TEST_CASE("engine: alltoall float32 matches the reference on 2 GPUs") { sweep(CollOp::AllToAll, DType::Float32); }
TEST_CASE("engine: alltoall bfloat16 matches the reference on 2 GPUs") { sweep(CollOp::AllToAll, DType::BFloat16); }
TEST_CASE("engine: alltoall float16 matches the reference on 2 GPUs") { sweep(CollOp::AllToAll, DType::Float16); }

TEST_CASE("engine: allreduce of 256 MiB float32 is exact") { large(CollOp::AllReduce); }
TEST_CASE("engine: allgather to 256 MiB float32 is exact") { large(CollOp::AllGather); }
TEST_CASE("engine: reducescatter from 256 MiB float32 is exact") { large(CollOp::ReduceScatter); }
TEST_CASE("engine: broadcast of 256 MiB float32 is exact") { large(CollOp::Broadcast); }
TEST_CASE("engine: alltoall of 256 MiB float32 is exact") { large(CollOp::AllToAll); }

TEST_CASE("engine: every allreduce generator and chunking gives the reference result") {
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2));
  uint64_t seed = 500;
  for (const auto& algo : mk::algorithmsFor(CollOp::AllReduce))
    for (uint32_t chunks : {1u, 3u})
      for (uint64_t count : {1021ull, (1ull << 20) + 3})
        for (DType dt : {DType::Float32, DType::BFloat16}) {
          mk::CollectiveSpec spec;
          spec.op = CollOp::AllReduce;
          spec.dtype = dt;
          spec.count = count;
          mk::CollOptions opt(algo);
          opt.chunks = chunks;
          CAPTURE(algo);
          CAPTURE(chunks);
          CAPTURE(count);
          CAPTURE(mk::toString(dt));
          CHECK(mkt::runAndCheck(comms, spec, false, seed++, true, opt) == 0);
        }
}

TEST_CASE("engine: every generator of the other collectives gives the reference result") {
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2));
  uint64_t seed = 900;
  for (CollOp op : {CollOp::AllGather, CollOp::ReduceScatter, CollOp::Broadcast, CollOp::AllToAll})
    for (const auto& algo : mk::algorithmsFor(op))
      for (uint64_t count : {333ull, (1ull << 19) + 1}) {
        mk::CollectiveSpec spec;
        spec.op = op;
        spec.count = count;
        mk::CollOptions opt(algo);
        opt.chunks = 2;
        CAPTURE(mk::toString(op));
        CAPTURE(algo);
        CAPTURE(count);
        CHECK(mkt::runAndCheck(comms, spec, false, seed++, true, opt) == 0);
      }
}

TEST_CASE("engine: uniform random allreduce sums stay within one rounding of the reference") {
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2));
  for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16}) {
    mk::CollectiveSpec spec;
    spec.op = CollOp::AllReduce;
    spec.dtype = dt;
    spec.count = 100003;
    CAPTURE(mk::toString(dt));
    CHECK(mkt::runAndCheck(comms, spec, false, 4242 + static_cast<uint64_t>(dt), false) == 0);
  }
}

TEST_CASE("engine: back-to-back ops on separate buffers and chained ops both give exact results") {
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2));
  const uint32_t n = 2;
  const uint64_t count = 4099;
  const int kOps = 12;
  mkt::Streams streams(comms);
  // Independent ops: op k reduces in_k into out_k (no fence between them: they may overlap).
  std::vector<std::vector<std::unique_ptr<mkt::DeviceBuffer>>> in(n), out(n);
  std::vector<std::vector<std::vector<float>>> values(n);
  for (uint32_t r = 0; r < n; ++r)
    for (int k = 0; k < kOps; ++k) {
      values[r].push_back(mkt::randomValues(DType::Float32, count, 31 * k + r, true));
      in[r].push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), count * 4));
      out[r].push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), count * 4));
      in[r][k]->upload(values[r][k].data(), count * 4);
      out[r][k]->fill(0xFF);
    }
  mk::groupStart();
  for (int k = 0; k < kOps; ++k)
    for (uint32_t r = 0; r < n; ++r)
      comms[r].allReduce(in[r][k]->get(), out[r][k]->get(), count, DType::Float32, RedOp::Sum, streams.s[r]);
  mk::groupEnd();
  streams.sync(comms);
  uint64_t bad = 0;
  for (uint32_t r = 0; r < n; ++r)
    for (int k = 0; k < kOps; ++k) {
      std::vector<float> got(count);
      out[r][k]->download(got.data(), count * 4);
      for (uint64_t i = 0; i < count; ++i) bad += got[i] != values[0][k][i] + values[1][k][i];
    }
  CHECK(bad == 0);
  // Chained ops: each reads what the previous wrote (the fence rule), so the result doubles each time.
  mk::groupStart();
  for (int k = 0; k < 5; ++k)
    for (uint32_t r = 0; r < n; ++r)
      comms[r].allReduce(in[r][0]->get(), in[r][0]->get(), count, DType::Float32, RedOp::Sum, streams.s[r]);
  mk::groupEnd();
  streams.sync(comms);
  for (uint32_t r = 0; r < n; ++r) {
    std::vector<float> got(count);
    in[r][0]->download(got.data(), count * 4);
    uint64_t wrong = 0;
    for (uint64_t i = 0; i < count; ++i) wrong += got[i] != 16.f * (values[0][0][i] + values[1][0][i]);
    CHECK(wrong == 0);
  }
}

TEST_CASE("engine: both stream hand-offs order each op between the caller's stream work before and after it") {
  // Per op: a memset writes the input on the caller's stream, the all-reduce reads it, a copy on the same
  // stream takes the output away. Wrong order on either side shows as a stale or missing value.
  for (const mk::StreamHandoff handoff : {mk::StreamHandoff::Kernel, mk::StreamHandoff::MemOps}) {
    CAPTURE(static_cast<int>(handoff));
    mk::CommConfig cfg;
    cfg.streamHandoff = handoff;
    auto comms = mk::Communicator::createLocal(mkt::firstDevices(2), cfg);
    const uint64_t count = 1031;
    const int kOps = 16;
    mkt::Streams streams(comms);
    std::vector<std::unique_ptr<mkt::DeviceBuffer>> in, out, keep;
    for (uint32_t r = 0; r < 2; ++r) {
      in.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), count * 4));
      out.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), count * 4));
      keep.push_back(std::make_unique<mkt::DeviceBuffer>(comms[r].device(), kOps * count * 4));
    }
    for (int k = 0; k < kOps; ++k)
      for (uint32_t r = 0; r < 2; ++r) {
        MK_CUDA_CHECK(cudaSetDevice(comms[r].device()));
        MK_CUDA_CHECK(cudaMemsetAsync(in[r]->get(), 0x30 + k + static_cast<int>(r), count * 4, streams.s[r]));
        comms[r].allReduce(in[r]->get(), out[r]->get(), count, DType::Float32, RedOp::Sum, streams.s[r]);
        MK_CUDA_CHECK(cudaSetDevice(comms[r].device()));
        MK_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(keep[r]->get()) + k * count * 4, out[r]->get(), count * 4,
                                      cudaMemcpyDeviceToDevice, streams.s[r]));
      }
    streams.sync(comms);
    auto pattern = [](int byte) {
      uint32_t u = 0x01010101u * static_cast<uint32_t>(byte);
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    };
    uint64_t wrong = 0;
    for (uint32_t r = 0; r < 2; ++r) {
      std::vector<float> got(kOps * count);
      keep[r]->download(got.data(), got.size() * 4);
      for (int k = 0; k < kOps; ++k)
        for (uint64_t i = 0; i < count; ++i) wrong += got[k * count + i] != pattern(0x30 + k) + pattern(0x31 + k);
    }
    CHECK(wrong == 0);
  }
}

// mk-calibrate --import: nccl-tests output and bus-bandwidth tables are read (bad lines refused by file and line)
// and the efficiencies fitted from them through the layered model come back as they were made.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "mk/algorithms/nccl.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/topology/topology.hpp"
#include "mk/util/format.hpp"
#include "mk/validation/nccl_tests_import.hpp"

using namespace mk;

namespace {

/// `f` throws mk::Error of `code` whose message holds `part`.
template <class F>
void expectError(F&& f, ErrorCode code, const std::string& part) {
  try {
    f();
    FAIL("no error, expected: " << part);
  } catch (const Error& e) {
    CHECK(e.code() == code);
    CHECK_MESSAGE(std::string(e.what()).find(part) != std::string::npos, std::string(e.what()));
  }
}

/// validation/tests/data, next to the committed measurements' folder (validation/data/measured).
const std::string kData = std::string(MK_MEASURED_DIR) + "/../../tests/data/";

const char* kHeader =
    "# nccl-tests version 2.17.6 nccl-headers=23007 nccl-library=23007\n"
    "# Collective test starting: all_reduce_perf\n"
    "# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 8(factor) warmup iters: 5 iters: 20 agg iters: 1 "
    "validation: 1 graph: 0\n"
    "#\n"
    "#                                                              out-of-place                       in-place\n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw "
    "#wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n";

}  // namespace

TEST_CASE("import: nccl-tests rows are read out of place, with the op, ranks and launches of the run") {
  const std::string text = std::string("#  Rank  0 Group  0 Pid   1 on node0 device  0 [0000:18:00] NVIDIA H100\n") +
                           "#  Rank  1 Group  0 Pid   2 on node0 device  1 [0000:2a:00] NVIDIA H100\n" + kHeader +
                           "node0:1:1 [0] NCCL INFO Channel 00/16 : 0 1\n"
                           "        1024           256     float     sum      -1    20.50    0.05    0.05      0"
                           "    19.90    0.05    0.05      0\n"
                           "# Out of bounds values : 0 OK\n";
  const BusBwInput in = parseNcclTests(text, "ar.txt");
  REQUIRE(in.rows.size() == 1);
  CHECK(in.ranks == 2);
  CHECK(in.rows[0].op == CollOp::AllReduce);
  CHECK(in.rows[0].bytes == 1024);
  CHECK(in.rows[0].timeUs == doctest::Approx(20.5));  // out-of-place, not the in-place 19.9
  CHECK(in.rows[0].launchesPerOp == 1);
  CHECK(in.rows[0].where == "ar.txt:11");
}

TEST_CASE("import: a line that does not parse is refused naming the file and the line") {
  const std::string good =
      "        1024           256     float     sum      -1    20.50    0.05    0.05      0"
      "    19.90    0.05    0.05      0\n";
  struct Case {
    std::string row;
    const char* message;
  };
  for (const Case& c :
       {Case{"   1024   256   float   sum   -1   20.5   0.05   0.05   0\n", "ar.txt:8: a result row has 13"},
        Case{"   1024   256   float   sum   -1   fast   0.05   0.05   0   19.9   0.05   0.05   0\n",
             "ar.txt:8: time (us) must be a number"},
        Case{"   10.5   256   float   sum   -1   20.5   0.05   0.05   0   19.9   0.05   0.05   0\n",
             "ar.txt:8: size must be a whole number"},
        Case{"   1024   256   float   sum   -1   20.5   0.05   0.05   3   19.9   0.05   0.05   0\n",
             "ar.txt:8: the row reports 3 wrong elements"},
        Case{"   1024   256   int8   sum   -1   20.5   0.05   0.05   0   19.9   0.05   0.05   0\n",
             "ar.txt:8: type \"int8\""}}) {
    CAPTURE(c.row);
    expectError([&] { parseNcclTests(kHeader + c.row, "ar.txt"); }, ErrorCode::ParseError, c.message);
  }
  expectError([&] { parseNcclTests(good, "ar.txt"); }, ErrorCode::ParseError,
              {"ar.txt:1: a result row before \"# Collective test starting"});
  expectError([&] { parseNcclTests("# Collective test starting: sendrecv_perf\n" + good, "sr.txt"); },
              ErrorCode::ParseError, "sr.txt:1: test \"sendrecv_perf\" is not read");
}

TEST_CASE("import: a bus-bandwidth table needs its units, and its rows their columns") {
  const BusBwInput in =
      parseBusBwTable("# my cluster\nop,bytes,busbw_GBs,time_us\nallgather,1048576,12.5,80\n", "t.csv");
  REQUIRE(in.rows.size() == 1);
  CHECK(in.rows[0].op == CollOp::AllGather);
  CHECK(in.rows[0].busBwGBs == 12.5);
  CHECK(in.rows[0].where == "t.csv:3");
  expectError([] { parseBusBwTable("op,bytes,busbw\nallreduce,1024,1.5\n", "t.csv"); }, ErrorCode::ParseError,
              {"t.csv:1: column \"busbw\" has no unit"});
  expectError([] { parseBusBwTable("op,bytes,busbw_GBs\nallreduce,1024\n", "t.csv"); }, ErrorCode::ParseError,
              {"t.csv:2: a row has 3 columns"});
  expectError([] { parseBusBwTable("op,bytes,busbw_GBs\nallreduce,1k,2\n", "t.csv"); }, ErrorCode::ParseError,
              {"t.csv:2: bytes must be a whole number"});
  expectError([] { parseBusBwTable("op,bytes,busbw_GBs\nsendrecv,1024,2\n", "t.csv"); }, ErrorCode::ParseError,
              {"t.csv:2: op \"sendrecv\""});
}

TEST_CASE("import: rows made by the layered model at known efficiencies give them back") {
  // all_reduce_perf on 2 x dgx-h100 as nccl-tests prints it (2 decimals), its times the layered model's at network
  // efficiency 0.8 and transport latency 7 us: made here, so that the test follows the model as it changes. The
  // committed file is such a run (made the same way) and must still read as one.
  const Topology topo = topologyPreset("dgx-h100", 2);
  const BusBwInput committed = readBusBwFile(kData + "nccl-tests-allreduce-2x-dgx-h100.txt");
  CHECK(committed.ranks == 16);
  CHECK(committed.rows.size() == 10);
  Profile truth = defaultProfile(topo);
  truth.network.bwGBs *= 0.8;
  truth.transport.latencyUs = 7;
  std::string text = kHeader;
  for (const BusBwRow& r : committed.rows) {
    const uint64_t count = countForBytes(r.op, r.bytes, r.dtype, 16);
    const double t =
        layeredOpUs(layeredCandidates(r.op, count, r.dtype, topo, 16, truth).front().closedFormUs, truth, 1);
    const double alg = static_cast<double>(r.bytes) / t / 1e3, bus = alg * busBwFactor(r.op, 16);
    text += strprintf("%12llu  %12llu  %8s  %6s  %6s  %7.2f  %6.2f  %6.2f  %6d  %7.2f  %6.2f  %6.2f  %6d\n",
                      static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(count), "float", "sum",
                      "-1", t, alg, bus, 0, t, alg, bus, 0);
  }
  const BusBwInput in = parseNcclTests(text, "made.txt");
  const BusBwFit fit = fitBusBw(in.rows, topo, defaultProfile(topo));
  CHECK(fit.network);
  CHECK(fit.efficiency == doctest::Approx(0.8).epsilon(0.01));
  REQUIRE(fit.latencyFitted);
  CHECK(fit.latencyUs == doctest::Approx(7.0).epsilon(0.03));
  for (const BusBwRowFit& r : fit.rows) {
    CAPTURE(r.row.where);
    CHECK(std::abs(r.residual) < 0.01);  // the file prints 2 decimals
  }
  CHECK(fit.profile.network.bwGBs == doctest::Approx(0.8 * defaultProfile(topo).network.bwGBs).epsilon(0.01));
  // The wrong cluster: on 4 nodes the same rows' busbw and time disagree (another rank count).
  expectError([&] { fitBusBw(in.rows, topologyPreset("dgx-h100", 4), defaultProfile(topologyPreset("dgx-h100", 4))); },
              ErrorCode::InvalidArgument, "disagree on 32 ranks");
}

TEST_CASE("import: too few large rows to fit a rate are refused") {
  const Topology topo = topologyPreset("dgx-h100", 2);
  const BusBwInput in = parseBusBwTable("op,bytes,busbw_GBs\nallreduce,1048576,10\nallreduce,33554432,80\n", "t.csv");
  expectError([&] { fitBusBw(in.rows, topo, defaultProfile(topo)); }, ErrorCode::InvalidArgument,
              {"at least 2 rows of >= 16 MiB (got 1"});
}

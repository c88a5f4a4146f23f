#include <doctest/doctest.h>

#include <string>

#include "mk/error.hpp"
#include "mk/util/size.hpp"

namespace {
void requireBadSize(const char* text, const char* why) {
  try {
    mk::parseSize(text);
    FAIL("accepted '" << text << "'");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::InvalidArgument);
    CHECK_MESSAGE(std::string(e.what()).find(why) != std::string::npos, e.what());
  }
}
}  // namespace

TEST_CASE("size: plain numbers and binary suffixes") {
  CHECK(mk::parseSize("8") == 8);
  CHECK(mk::parseSize("1048573") == 1048573);
  CHECK(mk::parseSize("1K") == 1024);
  CHECK(mk::parseSize("1KiB") == 1024);
  CHECK(mk::parseSize("64k") == 65536);
  CHECK(mk::parseSize("1MiB") == 1048576);
  CHECK(mk::parseSize("512M") == 512ull << 20);
  CHECK(mk::parseSize("1G") == 1ull << 30);
  CHECK(mk::parseSize("2GB") == 2ull << 30);
  CHECK(mk::parseSize("1T") == 1ull << 40);
  CHECK(mk::parseSize("0") == 0);
  CHECK(mk::parseSize("17B") == 17);
}

TEST_CASE("size: negative fractional garbage and overflowing sizes are rejected") {
  requireBadSize("-1", "negative");
  requireBadSize("", "empty");
  requireBadSize("abc", "no digits");
  requireBadSize("1.5G", "fractions");
  requireBadSize("12Q", "unknown suffix");
  requireBadSize("99999999999999999999", "too large");
  requireBadSize("20000000000T", "too large");
}

TEST_CASE("size: a lower-case b is a bit and refused, not read as bytes") {
  for (const char* text : {"1Gb", "1gb", "8Mib", "64Kb", "512b"}) {
    CAPTURE(text);
    requireBadSize(text, "a lower-case b is a bit, not a byte");
  }
  CHECK(mk::parseSize("1GB") == 1ull << 30);
  CHECK(mk::parseSize("1gB") == 1ull << 30);
}

TEST_CASE("size: a size is one word: spaces anywhere are refused") {
  for (const char* text : {"1 K B", "1 KiB", " 8", "8 ", "6 4K", "1\tK", " "}) {
    CAPTURE(text);
    requireBadSize(text, "spaces are not allowed");
  }
}

TEST_CASE("size: formatSize picks the largest exact binary unit") {
  CHECK(mk::formatSize(1048576) == "1 MiB");
  CHECK(mk::formatSize(1048573) == "1048573 B");
  CHECK(mk::formatSize(3072) == "3 KiB");
  CHECK(mk::formatSize(0) == "0 B");
  CHECK(mk::formatSize(1ull << 30) == "1 GiB");
}

TEST_CASE("error: what() carries the code name and the message") {
  const mk::Error e(mk::ErrorCode::Timeout, "rank 1 lane 0 waited for flag 3");
  CHECK(std::string(e.what()) == "timeout: rank 1 lane 0 waited for flag 3");
  CHECK(e.message() == "rank 1 lane 0 waited for flag 3");
  CHECK(e.code() == mk::ErrorCode::Timeout);
  CHECK(std::string(mk::toString(mk::ErrorCode::InvalidSchedule)) == "invalid-schedule");
}

#include "mk/algorithms/request.hpp"

TEST_CASE("request: bytes become the op's count as nccl-tests sizes them") {
  CHECK(mk::countForBytes(mk::CollOp::AllReduce, 1048573, mk::DType::Float32, 8) == 262143);
  CHECK(mk::countForBytes(mk::CollOp::AllGather, 1u << 20, mk::DType::BFloat16, 8) == 65536);
  CHECK(mk::countForBytes(mk::CollOp::AllToAll, 7, mk::DType::Float32, 2) == 0);
  CHECK(mk::minBytesFor(mk::CollOp::ReduceScatter, mk::DType::Float16, 8) == 16);
  CHECK(mk::minBytesFor(mk::CollOp::Broadcast, mk::DType::Float32, 8) == 4);
}

TEST_CASE("request: ranks grow the cluster unless nodes are explicit") {
  const auto grown = mk::placeRanks("dgx-h100", 0, 20);
  CHECK(grown.topo.nodes == 3);
  CHECK(grown.nRanks == 20);
  const auto all = mk::placeRanks("dgx-h200", 2, 0);
  CHECK(all.nRanks == 16);
  CHECK(mk::placeRanks("dgx-h100", 0, 0, 4).topo.nodes == 4);
  try {
    mk::placeRanks("dgx-h100", 1, 9);
    FAIL("9 ranks on one 8-GPU node were accepted");
  } catch (const mk::Error& e) {
    CHECK(std::string(e.what()).find("does not fit") != std::string::npos);
  }
}

TEST_CASE("request: the words of a command line become a typed request, auto leaving algorithm and shape open") {
  mk::CollectiveArgs a;
  a.op = "reduce-scatter";
  a.algo = "direct";
  a.dtype = "bf16";
  a.redop = "max";
  a.root = 3;
  a.chunks = 2;
  a.chunksGiven = true;
  a.channels = 3;  // not given: the engine's rule decides
  a.inter = "rhd";
  mk::CollectiveRequest r = mk::parseCollective(a);
  CHECK(r.spec.op == mk::CollOp::ReduceScatter);
  REQUIRE(r.algo.has_value());
  CHECK(*r.algo == mk::Algorithm::Direct);
  CHECK(r.spec.algo == mk::Algorithm::Direct);
  CHECK(r.spec.dtype == mk::DType::BFloat16);
  CHECK(r.spec.redop == mk::RedOp::Max);
  CHECK(r.spec.root == 3);
  CHECK(r.spec.count == 0);
  CHECK(r.gen.chunks == 2);    // asked for: kept
  CHECK(r.gen.channels == 0);  // not asked for: the engine's rule per size (planCollective)
  CHECK(r.gen.inter == mk::InterPhase::Rhd);

  a.algo = "auto";
  a.chunksGiven = false;
  r = mk::parseCollective(a);
  CHECK_FALSE(r.algo.has_value());
  CHECK(r.gen.chunks == 0);  // not given: the size table's
  CHECK(r.gen.channels == 0);
  a.chunksGiven = true;
  CHECK(mk::parseCollective(a).gen.chunks == 2);
  CHECK(mk::parseCollective(a).gen.channels == 0);

  auto error = [](mk::CollectiveArgs bad) -> std::string {
    try {
      (void)mk::parseCollective(bad);
    } catch (const mk::Error& e) {
      return e.message();
    }
    return "no error";
  };
  mk::CollectiveArgs bad;
  bad.op = "allsum";
  CHECK(error(bad).find("unknown --op 'allsum' (expected allreduce,") == 0);
  bad = {};
  bad.dtype = "int7";
  CHECK(error(bad).find("unknown --dtype 'int7' (expected float32,") == 0);
  bad = {};
  bad.redop = "prod";
  CHECK(error(bad).find("unknown --redop 'prod' (expected sum,") == 0);
  bad = {};
  bad.algo = "star";
  CHECK(error(bad) == "unknown algorithm 'star' for allreduce (expected one-shot, two-shot, ring, hierarchical)");
  bad.op = "alltoall";
  bad.algo = "ring";
  CHECK(error(bad) == "unknown algorithm 'ring' for alltoall (expected direct)");
  bad = {};
  bad.inter = "tree";
  CHECK(error(bad).find("unknown --inter 'tree'") == 0);
}

TEST_CASE("request: a size below one element per rank block is bad input naming the least size") {
  CHECK(mk::requireCountForBytes(mk::CollOp::AllGather, 64, mk::DType::Float32, 8) == 2);
  try {
    (void)mk::requireCountForBytes(mk::CollOp::AllGather, 8, mk::DType::Float32, 8);
    FAIL("8 bytes accepted for 8 float32 blocks");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::InvalidArgument);
    CHECK(e.message() == "--bytes 8 holds less than one float32 element per rank (need at least 32 bytes)");
  }
}

TEST_CASE("size: durations and byte amounts print with a readable unit") {
  CHECK(mk::formatMicros(3.5) == "3.500 us");
  CHECK(mk::formatMicros(12291.0) == "12.291 ms");
  CHECK(mk::formatMicros(1.25e6) == "1.250 s");
  CHECK(mk::formatBytes(512) == "512 B");
  CHECK(mk::formatBytes(7.0 * 1024 * 1024) == "7.00 MiB");
  CHECK(mk::formatBytes(1536) == "1.50 KiB");
}

// CPU tests of the inter-node wire protocol's records: sizes, the CRC, and every check a receiver makes on a
// header or trailer (each corruption is named), and the default listen address.
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "mk/error.hpp"
#include "proxy/socket_setup.hpp"
#include "proxy/wire.hpp"

namespace {

namespace wire = mk::proxy::wire;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

wire::FrameHeader putHeader() {
  wire::FrameHeader h{};
  h.type = static_cast<uint8_t>(wire::FrameType::Put);
  h.flags = wire::kFrameSignal;
  h.srcRank = 3;
  h.dstRank = 5;
  h.opTag = 17;
  h.lane = 2;
  h.buffer = 1;
  h.step = 9;
  h.flagId = 4;
  h.offset = 4096;
  h.bytes = 1000;
  h.value = 1;
  return h;
}

}  // namespace

TEST_CASE("wire: records have their documented sizes and the CRC is CRC32C") {
  CHECK(sizeof(wire::FrameHeader) == 64);
  CHECK(sizeof(wire::FrameTrailer) == 16);
  CHECK(sizeof(wire::Hello) == 48);
  CHECK(sizeof(wire::AddressRecord) == 32);
  CHECK(wire::crc32c("123456789", 9) == 0xE3069283u);  // the Castagnoli check value
  CHECK(wire::crc32c("", 0) == 0u);
  // Streaming: the CRC of two pieces continued equals the CRC of the whole (what chunked payloads rely on).
  const char text[] = "the quick brown fox jumps over the lazy dog, twice over: the quick brown fox";
  const std::size_t n = sizeof text - 1;
  for (std::size_t cut : {0ul, 1ul, 7ul, 8ul, 9ul, 33ul, n})
    CHECK(wire::crc32c(text + cut, n - cut, wire::crc32c(text, cut)) == wire::crc32c(text, n));
  // The magic numbers read as their names in a byte dump.
  uint32_t m = wire::kFrameMagic;
  CHECK(std::string(reinterpret_cast<const char*>(&m), 4) == "MKPF");
  m = wire::kHelloMagic;
  CHECK(std::string(reinterpret_cast<const char*>(&m), 4) == "MKPH");
}

TEST_CASE("wire: a sealed header passes, and each corruption is named") {
  wire::FrameHeader h = putHeader();
  wire::sealFrame(h, 12);
  CHECK(wire::frameProblem(h, 12).empty());
  CHECK(contains(wire::frameProblem(h, 13), "frame sequence 12, expected 13"));
  {
    wire::FrameHeader bad = h;
    bad.bytes ^= 1;  // one bit flipped in flight
    CHECK(contains(wire::frameProblem(bad, 12), "header CRC mismatch"));
  }
  {
    wire::FrameHeader bad = h;
    bad.magic = 0x12345678;
    CHECK(contains(wire::frameProblem(bad, 12), "not a frame header"));
  }
  {
    wire::FrameHeader bad = putHeader();
    bad.type = 77;
    wire::sealFrame(bad, 0);
    CHECK(contains(wire::frameProblem(bad, 0), "unknown frame type 77"));
  }
  {
    wire::FrameHeader bad = putHeader();
    bad.flags = 0x80;
    wire::sealFrame(bad, 0);
    CHECK(contains(wire::frameProblem(bad, 0), "unknown flag bits 128"));
  }
  {
    wire::FrameHeader bad = putHeader();
    bad.bytes = 0;
    wire::sealFrame(bad, 0);
    CHECK(contains(wire::frameProblem(bad, 0), "a put frame without payload"));
  }
  {
    wire::FrameHeader bad{};
    bad.type = static_cast<uint8_t>(wire::FrameType::Control);
    bad.bytes = wire::kMaxControlBytes + 1;
    wire::sealFrame(bad, 0);
    CHECK(contains(wire::frameProblem(bad, 0), "a control frame of 65537 payload bytes (at most 65536)"));
  }
  {
    wire::FrameHeader bad{};
    bad.type = static_cast<uint8_t>(wire::FrameType::Signal);
    wire::sealFrame(bad, 0);
    CHECK(contains(wire::frameProblem(bad, 0), "a signal frame without the signal flag"));
  }
  {
    wire::FrameHeader bad = putHeader();
    wire::sealFrame(bad, 0);
    bad.version = 2;  // another protocol version (its CRC is checked after the version)
    CHECK(contains(wire::frameProblem(bad, 0), "protocol version 2, expected 1"));
  }
}

TEST_CASE("wire: trailers catch a payload of the wrong length and a corrupted payload") {
  const wire::FrameTrailer good{wire::kTrailerMagic, 4, 1234, 0};
  CHECK(wire::trailerProblem(good, 4, true, 1234).empty());
  CHECK(wire::trailerProblem(good, 4, false, 999).empty());  // no checksum asked for
  CHECK(contains(wire::trailerProblem(good, 4, true, 1235), "payload checksum mismatch"));
  CHECK(contains(wire::trailerProblem(good, 5, false, 0), "trailer of frame 4 after the payload of frame 5"));
  const wire::FrameTrailer shifted{0x41414141, 4, 0, 0};  // payload bytes where the trailer should be
  CHECK(contains(wire::trailerProblem(shifted, 4, false, 0), "shorter or longer than its header said"));
}

TEST_CASE("wire: handshakes carry their CRC and a reject carries no token") {
  const uint64_t token[2] = {0x1122334455667788ull, 0x99aabbccddeeff00ull};
  const wire::Hello hello = wire::makeHello(wire::HelloKind::Hello, 2, 0, 3, token);
  CHECK(wire::helloCrcOk(hello));
  CHECK(hello.token[0] == token[0]);
  wire::Hello bad = hello;
  bad.fromProcess = 1;
  CHECK_FALSE(wire::helloCrcOk(bad));
  const wire::Hello reject = wire::makeHello(wire::HelloKind::Reject, 0, 2, 3, token, wire::RejectReason::Token);
  CHECK(wire::helloCrcOk(reject));
  CHECK(reject.token[0] == 0);
  CHECK(reject.token[1] == 0);
  CHECK(std::string(wire::toString(wire::RejectReason::Version)) == "another protocol version");
}

TEST_CASE("wire: the default listen address is loopback on one host, and a loopback name across hosts is refused") {
  CHECK(mk::proxy::defaultListenAddress({"a", "a", "a"}, 1) == "127.0.0.1");
  CHECK(mk::proxy::defaultListenAddress({"localhost"}, 0) == "127.0.0.1");
  try {
    mk::proxy::defaultListenAddress({"localhost", "elsewhere"}, 0);
    FAIL("a loopback host name across hosts was accepted");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::InvalidArgument);
    CHECK(contains(e.message(), "'localhost', 'elsewhere'"));
    CHECK(contains(e.message(), "loopback address 127.0.0.1"));
  }
}

// mkernel — the inter-node wire protocol's checks and CRC (wire.hpp).
#include "proxy/wire.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace mk::proxy::wire {
namespace {

/// The reflected Castagnoli polynomial's byte table, built once.
const std::array<uint32_t, 256>& crcTable() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

uint32_t crcSoftware(const unsigned char* p, std::size_t n, uint32_t c) noexcept {
  const auto& t = crcTable();
  for (std::size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xffu] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crcHardware(const unsigned char* p, std::size_t n, uint32_t c) noexcept {
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c64 = _mm_crc32_u64(c64, word);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(c, *p);
  return c;
}
#endif

bool haveHardwareCrc() noexcept {
#if defined(__x86_64__)
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
#else
  return false;
#endif
}

}  // namespace

uint32_t crc32c(const void* data, std::size_t n, uint32_t crc) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (haveHardwareCrc()) return ~crcHardware(p, n, c);
#endif
  return ~crcSoftware(p, n, c);
}

const char* toString(RejectReason reason) noexcept {
  switch (reason) {
    case RejectReason::None: return "none";
    case RejectReason::Version: return "another protocol version";
    case RejectReason::Token: return "not the job's token";
    case RejectReason::UnknownProcess: return "a process this one does not expect";
    case RejectReason::DuplicateProcess: return "a process that is already connected";
    case RejectReason::WrongTarget: return "meant for another process or job size";
    case RejectReason::Malformed: return "a malformed handshake";
  }
  return "an unknown reason";
}

const char* toString(FrameType type) noexcept {
  switch (type) {
    case FrameType::Put: return "put";
    case FrameType::Signal: return "signal";
    case FrameType::Control: return "control";
    case FrameType::Abort: return "abort";
    case FrameType::Goodbye: return "goodbye";
  }
  return "unknown";
}

Hello makeHello(HelloKind kind, uint32_t fromProcess, uint32_t toProcess, uint32_t processes, const uint64_t token[2],
                RejectReason reason) noexcept {
  Hello h{};
  h.magic = kHelloMagic;
  h.version = kProtocolVersion;
  h.kind = static_cast<uint16_t>(kind);
  h.fromProcess = fromProcess;
  h.toProcess = toProcess;
  h.processes = processes;
  h.reason = static_cast<uint32_t>(reason);
  if (kind != HelloKind::Reject && token) {
    h.token[0] = token[0];
    h.token[1] = token[1];
  }
  h.crc = crc32c(&h, sizeof h);
  return h;
}

bool helloCrcOk(const Hello& h) noexcept {
  Hello copy = h;
  copy.crc = 0;
  return crc32c(&copy, sizeof copy) == h.crc;
}

void sealFrame(FrameHeader& h, uint32_t seq) noexcept {
  h.magic = kFrameMagic;
  h.version = static_cast<uint8_t>(kProtocolVersion);
  h.seq = seq;
  h.crc = 0;
  h.crc = crc32c(&h, sizeof h);
}

std::string frameProblem(const FrameHeader& h, uint32_t expectedSeq) {
  if (h.magic != kFrameMagic) return "not a frame header (magic " + std::to_string(h.magic) + ")";
  if (h.version != static_cast<uint8_t>(kProtocolVersion))
    return "protocol version " + std::to_string(h.version) + ", expected " + std::to_string(kProtocolVersion);
  FrameHeader copy = h;
  copy.crc = 0;
  if (crc32c(&copy, sizeof copy) != h.crc) return "header CRC mismatch (corrupted header)";
  if (h.seq != expectedSeq)
    return "frame sequence " + std::to_string(h.seq) + ", expected " + std::to_string(expectedSeq) +
           " (a frame was lost, repeated or misparsed)";
  if ((h.flags & ~kFrameKnownFlags) != 0) return "unknown flag bits " + std::to_string(h.flags & ~kFrameKnownFlags);
  const auto type = static_cast<FrameType>(h.type);
  uint64_t limit = 0;
  switch (type) {
    case FrameType::Put: limit = kMaxPutBytes; break;
    case FrameType::Signal:
      if (!(h.flags & kFrameSignal)) return "a signal frame without the signal flag";
      break;
    case FrameType::Control: limit = kMaxControlBytes; break;
    case FrameType::Abort: limit = kMaxAbortBytes; break;
    case FrameType::Goodbye: break;
    default: return "unknown frame type " + std::to_string(h.type);
  }
  if (h.bytes > limit)
    return std::string("a ") + toString(type) + " frame of " + std::to_string(h.bytes) + " payload bytes (at most " +
           std::to_string(limit) + ")";
  if (type == FrameType::Put && h.bytes == 0) return "a put frame without payload (a signal is a signal frame)";
  if ((h.flags & kFrameChecksum) && !hasTrailer(type)) return "a checksum flag on a frame without a trailer";
  return {};
}

std::string trailerProblem(const FrameTrailer& t, uint32_t expectedSeq, bool checksum, uint32_t computed) {
  if (t.magic != kTrailerMagic)
    return "no frame trailer where the payload should end (magic " + std::to_string(t.magic) +
           "): the payload was shorter or longer than its header said";
  if (t.seq != expectedSeq)
    return "trailer of frame " + std::to_string(t.seq) + " after the payload of frame " + std::to_string(expectedSeq);
  if (checksum && t.checksum != computed)
    return "payload checksum mismatch (CRC32C " + std::to_string(computed) + " computed, " +
           std::to_string(t.checksum) + " sent): the payload was corrupted";
  return {};
}

FrameHeader putHeader(const PutInfo& p, bool checksum) noexcept {
  FrameHeader h{};
  h.type = static_cast<uint8_t>(p.bytes > 0 ? FrameType::Put : FrameType::Signal);
  h.flags = static_cast<uint16_t>((p.signal ? kFrameSignal : 0) | (checksum && p.bytes > 0 ? kFrameChecksum : 0));
  h.srcRank = p.srcRank;
  h.dstRank = p.dstRank;
  h.opTag = p.opTag;
  h.lane = static_cast<uint16_t>(p.lane);
  h.step = p.step;
  h.buffer = p.dstBuffer;
  h.flagId = p.flagId;
  h.offset = p.dstOffset;
  h.bytes = p.bytes;
  h.value = p.flagValue;
  return h;
}

PutInfo putInfo(const FrameHeader& h) noexcept {
  PutInfo p;
  p.srcRank = h.srcRank;
  p.dstRank = h.dstRank;
  p.opTag = h.opTag;
  p.lane = h.lane;
  p.step = h.step;
  p.dstBuffer = h.buffer;
  p.dstOffset = h.offset;
  p.bytes = h.type == static_cast<uint8_t>(FrameType::Put) ? h.bytes : 0;
  p.signal = (h.flags & kFrameSignal) != 0;
  p.flagId = h.flagId;
  p.flagValue = h.value;
  return p;
}

FrameHeader controlHeader(const ControlMessage& m) noexcept {
  FrameHeader h{};
  h.type = static_cast<uint8_t>(FrameType::Control);
  h.flags = kFrameChecksum;
  h.buffer = m.code;
  h.srcRank = m.srcRank;
  h.dstRank = m.dstRank;
  h.opTag = m.opTag;
  h.value = m.value;
  h.offset = m.aux;
  h.bytes = m.body.size();
  return h;
}

ControlMessage controlMessage(const FrameHeader& h, int fromProcess) {
  ControlMessage m;
  m.code = h.buffer;
  m.srcRank = h.srcRank;
  m.dstRank = h.dstRank;
  m.opTag = h.opTag;
  m.value = h.value;
  m.aux = h.offset;
  m.fromProcess = fromProcess;
  return m;
}

FrameHeader abortHeader(int process, ErrorCode code, std::size_t textBytes) noexcept {
  FrameHeader h{};
  h.type = static_cast<uint8_t>(FrameType::Abort);
  h.flags = kFrameChecksum;
  h.srcRank = static_cast<uint32_t>(process);
  h.value = static_cast<uint64_t>(code);
  h.bytes = textBytes;
  return h;
}

ErrorCode abortCode(const FrameHeader& h) noexcept {
  return h.value <= static_cast<uint64_t>(ErrorCode::Internal) ? static_cast<ErrorCode>(h.value) : ErrorCode::Internal;
}

std::string describePut(const PutInfo& p) {
  return "rank " + std::to_string(p.srcRank) + " lane " + std::to_string(p.lane) + " step " + std::to_string(p.step) +
         " -> rank " + std::to_string(p.dstRank) + " op tag " + std::to_string(p.opTag) + " buffer " +
         std::to_string(p.dstBuffer) + " bytes [" + std::to_string(p.dstOffset) + ", +" + std::to_string(p.bytes) +
         ")" + (p.signal ? " then flag " + std::to_string(p.flagId) + " += " + std::to_string(p.flagValue) : "");
}

}  // namespace mk::proxy::wire

// mkernel — internal: the inter-node wire protocol (docs/inter-node.md, "Wire protocol"). Bit-exact records shared
// by the socket transport (handshake, frames) and the ibverbs transport (frames in its receive slots).
//
// Every record is little-endian in host order (static_assert below: a big-endian host does not build) with named
// field widths and a static_assert'ed size. The first 8 bytes of a handshake (magic, version, kind) keep their
// layout in every protocol version, so two versions can always tell each other apart; everything after them is
// only read once the version matched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "mk/proxy/transport.hpp"

namespace mk::proxy::wire {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the inter-node wire protocol is little-endian");

/// The protocol version this build speaks; a peer speaking another one is refused.
inline constexpr uint16_t kProtocolVersion = 1;

/// CRC32C (Castagnoli) of `n` bytes, continuing from `crc` (0 to start): SSE4.2 where the CPU has it, a table
/// otherwise. crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, std::size_t n, uint32_t crc = 0) noexcept;

// ---- bootstrap record ------------------------------------------------------------------------------------------

inline constexpr uint32_t kAddressMagic = 0x41504b4du;  ///< "MKPA"

/// What every process all-gathers through the bootstrap before connecting: where it listens. Rank 0's record
/// carries the job token (random, made once per transport); the others carry zero there.
struct AddressRecord {
  uint32_t magic;     ///< kAddressMagic
  uint16_t version;   ///< kProtocolVersion of the sender
  uint16_t port;      ///< TCP port it listens on (host order)
  uint32_t ipv4;      ///< IPv4 address it listens on (network order)
  uint32_t process;   ///< its bootstrap rank
  uint64_t token[2];  ///< the job token in rank 0's record, else zero
};
static_assert(sizeof(AddressRecord) == 32);
static_assert(std::is_trivially_copyable_v<AddressRecord>);

// ---- handshake -------------------------------------------------------------------------------------------------

inline constexpr uint32_t kHelloMagic = 0x48504b4du;  ///< "MKPH"

/// Handshake message kinds.
enum class HelloKind : uint16_t {
  Hello = 1,   ///< connector -> acceptor: who I am, whom I mean, the token
  Accept = 2,  ///< acceptor -> connector: the token back (only after the connector proved it knows it)
  Reject = 3,  ///< acceptor -> connector: why not (`reason`); the token is zero; the connection is closed next
};

/// Why an acceptor refused a connection.
enum class RejectReason : uint32_t {
  None = 0,
  Version = 1,           ///< another protocol version
  Token = 2,             ///< not the job's token
  UnknownProcess = 3,    ///< `fromProcess` is no process of the job, or not one this acceptor waits for
  DuplicateProcess = 4,  ///< that process is already connected
  WrongTarget = 5,       ///< `toProcess` or `processes` do not describe this acceptor
  Malformed = 6,         ///< bad kind or CRC
};
/// "protocol version", "job token", ... for messages.
const char* toString(RejectReason reason) noexcept;

/// One handshake message, 48 bytes, each side sends one.
struct Hello {
  uint32_t magic;        ///< kHelloMagic
  uint16_t version;      ///< kProtocolVersion of the sender
  uint16_t kind;         ///< HelloKind
  uint32_t fromProcess;  ///< the sender's bootstrap rank
  uint32_t toProcess;    ///< the bootstrap rank it means to reach
  uint32_t processes;    ///< the job's process count as the sender knows it
  uint32_t reason;       ///< RejectReason (Reject only)
  uint64_t token[2];     ///< the job token (Hello, Accept); zero in a Reject
  uint32_t crc;          ///< CRC32C of the 48 bytes with this field zero
  uint32_t reserved;     ///< zero
};
static_assert(sizeof(Hello) == 48);
static_assert(std::is_trivially_copyable_v<Hello>);

/// A handshake message with its CRC filled.
Hello makeHello(HelloKind kind, uint32_t fromProcess, uint32_t toProcess, uint32_t processes, const uint64_t token[2],
                RejectReason reason = RejectReason::None) noexcept;
/// True when `h`'s CRC matches its contents.
bool helloCrcOk(const Hello& h) noexcept;

// ---- frames ----------------------------------------------------------------------------------------------------

inline constexpr uint32_t kFrameMagic = 0x46504b4du;    ///< "MKPF"
inline constexpr uint32_t kTrailerMagic = 0x45504b4du;  ///< "MKPE"

/// What a frame carries.
enum class FrameType : uint8_t {
  Put = 1,      ///< `bytes` payload bytes for (dstRank, opTag, buffer) at byte `offset`; then a trailer
  Signal = 2,   ///< flag `flagId` of dstRank += value; no payload
  Control = 3,  ///< an engine message: code in `buffer`, `value`, `offset` (aux), `bytes` of body; then a trailer
  Abort = 4,    ///< the sender failed: `bytes` of text (why); then a trailer; srcRank = the failing process
  Goodbye = 5,  ///< orderly close: nothing follows on this connection
};
/// "put", "signal", ... for messages.
const char* toString(FrameType type) noexcept;

/// FrameHeader::flags bits.
inline constexpr uint16_t kFrameSignal = 1u << 0;    ///< Put / Signal: raise (dstRank, flagId) by value once landed
inline constexpr uint16_t kFrameChecksum = 1u << 1;  ///< the trailer carries the payload's CRC32C
inline constexpr uint16_t kFrameKnownFlags = kFrameSignal | kFrameChecksum;

/// Largest payloads accepted per frame type.
inline constexpr uint64_t kMaxPutBytes = uint64_t{1} << 40;
inline constexpr uint64_t kMaxControlBytes = 64 * 1024;
inline constexpr uint64_t kMaxAbortBytes = 4096;

/// The header of every frame, 64 bytes. Sequence numbers count the frames of one connection in one direction from
/// 0, so a lost, repeated or misparsed frame is caught at the next header.
struct FrameHeader {
  uint32_t magic;    ///< kFrameMagic
  uint8_t version;   ///< kProtocolVersion (low byte)
  uint8_t type;      ///< FrameType
  uint16_t flags;    ///< kFrame* bits
  uint32_t seq;      ///< frame number on this connection and direction
  uint32_t crc;      ///< CRC32C of the 64 bytes with this field zero
  uint32_t srcRank;  ///< the pushing rank (Put, Signal); the failing process (Abort); engine-defined (Control)
  uint32_t dstRank;  ///< the destination rank (Put, Signal); engine-defined (Control)
  uint32_t opTag;    ///< the op's tag on the pushing rank (Put, Signal, Control)
  uint16_t lane;     ///< the pushing lane (diagnostics)
  uint16_t buffer;   ///< destination buffer index (Put); message code (Control)
  uint32_t step;     ///< the pushing step (diagnostics)
  uint32_t flagId;   ///< flag to raise (kFrameSignal)
  uint64_t offset;   ///< destination byte offset (Put); aux value (Control)
  uint64_t bytes;    ///< payload bytes that follow the header
  uint64_t value;    ///< flag increment (kFrameSignal); value (Control)
};
static_assert(sizeof(FrameHeader) == 64);
static_assert(std::is_trivially_copyable_v<FrameHeader>);

/// After the payload of a Put, Control or Abort frame: proves the payload ended where the header said.
struct FrameTrailer {
  uint32_t magic;     ///< kTrailerMagic
  uint32_t seq;       ///< the header's seq
  uint32_t checksum;  ///< CRC32C of the payload when the header has kFrameChecksum, else zero
  uint32_t reserved;  ///< zero
};
static_assert(sizeof(FrameTrailer) == 16);

/// True for frame types whose payload is followed by a trailer.
inline bool hasTrailer(FrameType t) noexcept {
  return t == FrameType::Put || t == FrameType::Control || t == FrameType::Abort;
}

/// Fill magic, version, seq and the CRC of `h` (the other fields set by the caller).
void sealFrame(FrameHeader& h, uint32_t seq) noexcept;
/// What is wrong with a received header, or "" when it is sound: magic, version, CRC, sequence, type, flags, and
/// the payload size its type allows.
std::string frameProblem(const FrameHeader& h, uint32_t expectedSeq);
/// What is wrong with a received trailer, or "": magic, sequence, checksum (when `checksum` is set, against
/// `computed`).
std::string trailerProblem(const FrameTrailer& t, uint32_t expectedSeq, bool checksum, uint32_t computed);

/// The header of a put (a Put frame, or a Signal frame when it has no bytes); magic, seq and CRC are filled by
/// sealFrame().
FrameHeader putHeader(const PutInfo& put, bool checksum) noexcept;
/// The put a Put or Signal frame carries.
PutInfo putInfo(const FrameHeader& h) noexcept;
/// The header of a control frame for `m` (checksummed: small); magic, seq and CRC by sealFrame().
FrameHeader controlHeader(const ControlMessage& m) noexcept;
/// The message a control frame carries, without its body (which follows the header).
ControlMessage controlMessage(const FrameHeader& h, int fromProcess);
/// The header of an abort frame of `process` failing with `code`, `textBytes` of text following.
FrameHeader abortHeader(int process, ErrorCode code, std::size_t textBytes) noexcept;
/// The error code an abort frame carries (Internal when it is not one this build knows).
ErrorCode abortCode(const FrameHeader& h) noexcept;
/// "rank 3 lane 1 step 7 -> rank 5 op tag 2 buffer 1 bytes [4096, +1000) then flag 4 += 1": a put in messages.
std::string describePut(const PutInfo& put);

}  // namespace mk::proxy::wire

// mkernel — internal: the ibverbs calls the transport makes, behind one small interface in mkernel's own types.
//
// verbs_real.cpp is the only file that includes <infiniband/verbs.h> and calls rdma-core; everything else (the
// per-peer protocol in ib_peer.*, the transport in ib_transport.cpp) talks to this interface, so the protocol builds
// everywhere and its unit test can drive it with an in-memory double. One VerbsApi is one opened device: its
// protection domain and one completion queue shared by every queue pair.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mk::proxy::ib {

/// A port of the opened device.
struct PortInfo {
  uint16_t lid = 0;               ///< InfiniBand local id (0 on RoCE)
  uint32_t mtuBytes = 0;          ///< active path MTU in bytes (256 .. 4096)
  bool active = false;            ///< the port's state is ACTIVE
  bool ethernet = false;          ///< RoCE: addressed by GID, not LID
  std::array<uint8_t, 16> gid{};  ///< the GID at gidIndex
  uint8_t gidIndex = 0;
};

/// A registered memory region.
struct MemoryRegion {
  uint64_t handle = 0;  ///< the implementation's (an ibv_mr*)
  uint64_t addr = 0;    ///< its first byte (virtual address; the iova for dma-buf)
  uint64_t length = 0;
  uint32_t lkey = 0;
  uint32_t rkey = 0;
};

/// A reliable-connected queue pair.
struct QueuePair {
  uint64_t handle = 0;  ///< the implementation's (an ibv_qp*)
  uint32_t qpn = 0;
};

/// What a queue pair needs of its remote end to reach RTR.
struct RemoteAddress {
  uint32_t qpn = 0;
  uint32_t psn = 0;  ///< the remote's initial send PSN (this end's expected receive PSN)
  uint16_t lid = 0;
  std::array<uint8_t, 16> gid{};
  uint32_t mtuBytes = 0;  ///< the path MTU both ends use (the smaller of the two)
  bool global = false;    ///< route by GID (RoCE, or across subnets)
};

/// One gather element of a work request.
struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

/// What completed.
enum class CompletionKind : uint8_t {
  WriteImm,      ///< a WRITE_WITH_IMM this end posted
  SendImm,       ///< a SEND_WITH_IMM this end posted
  RecvWriteImm,  ///< a remote WRITE_WITH_IMM landed in this end's memory (consumed a posted receive)
  RecvSendImm,   ///< a remote SEND_WITH_IMM arrived (consumed a posted receive)
  Other,
};

/// One work completion.
struct Completion {
  uint64_t wrId = 0;
  uint32_t qpn = 0;  ///< the local queue pair it belongs to
  CompletionKind kind = CompletionKind::Other;
  bool ok = false;
  std::string status;  ///< ibv_wc_status_str when not ok
  uint32_t imm = 0;    ///< immediate data (host order) of the Recv kinds
};

/// An RDMA device as the transport uses it. Throws mk::Error (IoError / Unsupported) naming the verb and errno.
class VerbsApi {
 public:
  virtual ~VerbsApi() = default;
  /// Names of the RDMA devices; empty with `why` filled when there are none (ibv_get_device_list returned NULL,
  /// e.g. ENOSYS without the kernel modules, or an empty list).
  virtual std::vector<std::string> deviceNames(std::string* why) = 0;
  /// Open `device` ("" = the first) and its port `port`: context, protection domain, one completion queue of
  /// `cqDepth` entries. Returns the port's facts.
  virtual PortInfo open(const std::string& device, uint8_t port, uint32_t cqDepth) = 0;
  /// Register host memory for local access, remote write, or both.
  virtual MemoryRegion registerHost(void* addr, std::size_t bytes, bool remoteWrite) = 0;
  /// Register device memory exported as a dma-buf (fd and offset from cuMemGetHandleForAddressRange), mapped at
  /// virtual address `iova`. Throws Error(Unsupported) when the provider or kernel cannot.
  virtual MemoryRegion registerDmabuf(int fd, uint64_t offset, std::size_t bytes, uint64_t iova) = 0;
  virtual void deregister(const MemoryRegion& region) noexcept = 0;
  /// A reliable-connected queue pair on the completion queue with room for `sendDepth` and `recvDepth` requests.
  virtual QueuePair createQp(uint32_t sendDepth, uint32_t recvDepth) = 0;
  /// RESET -> INIT (remote write allowed), INIT -> RTR (towards `remote`), RTR -> RTS (sending from `psn`).
  virtual void toInit(const QueuePair& qp, uint8_t port) = 0;
  virtual void toRtr(const QueuePair& qp, uint8_t port, const RemoteAddress& remote, uint8_t gidIndex) = 0;
  virtual void toRts(const QueuePair& qp, uint32_t psn) = 0;
  virtual void destroyQp(const QueuePair& qp) noexcept = 0;
  /// RDMA WRITE_WITH_IMM of the gathered `sges` to `remoteAddr` (rkey), signalled.
  virtual void postWriteImm(const QueuePair& qp, uint64_t wrId, const Sge* sges, int count, uint64_t remoteAddr,
                            uint32_t rkey, uint32_t imm) = 0;
  /// A zero-byte SEND_WITH_IMM, signalled.
  virtual void postSendImm(const QueuePair& qp, uint64_t wrId, uint32_t imm) = 0;
  /// A zero-byte receive (what a WRITE_WITH_IMM or a SEND_WITH_IMM from the remote consumes).
  virtual void postRecv(const QueuePair& qp, uint64_t wrId) = 0;
  /// Up to `max` completions, without waiting.
  virtual std::size_t pollCq(Completion* out, std::size_t max) = 0;
};

/// The rdma-core implementation (verbs_real.cpp; only in builds with libibverbs).
std::unique_ptr<VerbsApi> makeRealVerbs();

}  // namespace mk::proxy::ib

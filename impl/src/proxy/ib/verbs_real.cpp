// mkernel — the rdma-core calls of the ibverbs transport (verbs_api.hpp): the only file that includes
// <infiniband/verbs.h>. Never run on an RDMA NIC (docs/inter-node.md, "What has never run on a NIC").
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "mk/error.hpp"
#include "proxy/ib/verbs_api.hpp"

namespace mk::proxy::ib {
namespace {

std::string errnoText(int err) { return std::strerror(err) + std::string(" (errno ") + std::to_string(err) + ")"; }

[[noreturn]] void fail(const std::string& verb, int err) {
  throw Error(ErrorCode::IoError, verb + " failed: " + errnoText(err));
}

ibv_mtu mtuEnum(uint32_t bytes) {
  switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    default: return IBV_MTU_4096;
  }
}

/// The GID to use on a RoCE port: a RoCE v2 entry with an IPv4-mapped address (routable), else index 0.
uint8_t pickGidIndex(ibv_context* ctx, uint8_t port, const ibv_port_attr& pa) {
  if (pa.link_layer != IBV_LINK_LAYER_ETHERNET) return 0;
  std::vector<ibv_gid_entry> table(static_cast<std::size_t>(pa.gid_tbl_len));
  const ssize_t n = ibv_query_gid_table(ctx, table.data(), table.size(), 0);
  for (ssize_t i = 0; i < n; ++i) {
    const ibv_gid_entry& e = table[static_cast<std::size_t>(i)];
    const uint8_t* raw = e.gid.raw;
    const bool v4mapped =
        std::all_of(raw, raw + 10, [](uint8_t b) { return b == 0; }) && raw[10] == 0xff && raw[11] == 0xff;
    if (e.port_num == port && e.gid_type == IBV_GID_TYPE_ROCE_V2 && v4mapped) return static_cast<uint8_t>(e.gid_index);
  }
  return 0;
}

class RealVerbs final : public VerbsApi {
 public:
  ~RealVerbs() override {
    if (cq_) ibv_destroy_cq(cq_);
    if (pd_) ibv_dealloc_pd(pd_);
    if (ctx_) ibv_close_device(ctx_);
  }

  std::vector<std::string> deviceNames(std::string* why) override {
    int n = 0;
    errno = 0;
    ibv_device** list = ibv_get_device_list(&n);
    std::vector<std::string> names;
    if (!list) {
      // NULL, typically ENOSYS: no RDMA support in this kernel / container. Not an error: "no devices".
      if (why) *why = "ibv_get_device_list returned no list: " + errnoText(errno);
      return names;
    }
    for (int i = 0; i < n; ++i) names.emplace_back(ibv_get_device_name(list[i]));
    ibv_free_device_list(list);
    if (names.empty() && why) *why = "ibv_get_device_list found no device";
    return names;
  }

  PortInfo open(const std::string& device, uint8_t port, uint32_t cqDepth) override {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (!list || n == 0) {
      if (list) ibv_free_device_list(list);
      throw Error(ErrorCode::Unsupported, "no RDMA device found; use transport socket");
    }
    ibv_device* dev = nullptr;
    std::string known;
    for (int i = 0; i < n; ++i) {
      const std::string name = ibv_get_device_name(list[i]);
      known += (known.empty() ? "" : ", ") + name;
      if (!dev && (device.empty() || device == name)) dev = list[i];
    }
    if (!dev) {
      ibv_free_device_list(list);
      throw Error(ErrorCode::NotFound, "no RDMA device named '" + device + "' (found: " + known + ")");
    }
    ctx_ = ibv_open_device(dev);
    const std::string name = ibv_get_device_name(dev);
    ibv_free_device_list(list);
    if (!ctx_) fail("ibv_open_device(" + name + ")", errno);
    ibv_port_attr pa{};
    if (const int rc = ibv_query_port(ctx_, port, &pa))
      fail("ibv_query_port(" + name + ", " + std::to_string(port) + ")", rc);
    PortInfo info;
    info.lid = pa.lid;
    info.mtuBytes = 128u << static_cast<unsigned>(pa.active_mtu);
    info.active = pa.state == IBV_PORT_ACTIVE;
    info.ethernet = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    info.gidIndex = pickGidIndex(ctx_, port, pa);
    ibv_gid gid{};
    if (const int rc = ibv_query_gid(ctx_, port, info.gidIndex, &gid)) fail("ibv_query_gid", rc);
    std::memcpy(info.gid.data(), gid.raw, 16);
    pd_ = ibv_alloc_pd(ctx_);
    if (!pd_) fail("ibv_alloc_pd", errno);
    cq_ = ibv_create_cq(ctx_, static_cast<int>(cqDepth), nullptr, nullptr, 0);
    if (!cq_) fail("ibv_create_cq(" + std::to_string(cqDepth) + " entries)", errno);
    return info;
  }

  MemoryRegion registerHost(void* addr, std::size_t bytes, bool remoteWrite) override {
    const int access = IBV_ACCESS_LOCAL_WRITE | (remoteWrite ? IBV_ACCESS_REMOTE_WRITE : 0);
    ibv_mr* mr = ibv_reg_mr(pd_, addr, bytes, access);
    if (!mr) fail("ibv_reg_mr(" + std::to_string(bytes) + " bytes)", errno);
    return MemoryRegion{reinterpret_cast<uint64_t>(mr), reinterpret_cast<uint64_t>(addr), bytes, mr->lkey, mr->rkey};
  }

  MemoryRegion registerDmabuf(int fd, uint64_t offset, std::size_t bytes, uint64_t iova) override {
    ibv_mr* mr = ibv_reg_dmabuf_mr(pd_, offset, bytes, iova, fd, IBV_ACCESS_LOCAL_WRITE);
    if (!mr)
      throw Error(ErrorCode::Unsupported, "ibv_reg_dmabuf_mr(fd " + std::to_string(fd) + ", " + std::to_string(bytes) +
                                              " bytes) failed: " + errnoText(errno) +
                                              " (the driver or kernel cannot register GPU memory this way)");
    return MemoryRegion{reinterpret_cast<uint64_t>(mr), iova, bytes, mr->lkey, mr->rkey};
  }

  void deregister(const MemoryRegion& region) noexcept override {
    if (region.handle) ibv_dereg_mr(reinterpret_cast<ibv_mr*>(region.handle));
  }

  QueuePair createQp(uint32_t sendDepth, uint32_t recvDepth) override {
    ibv_qp_init_attr a{};
    a.send_cq = cq_;
    a.recv_cq = cq_;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = sendDepth;
    a.cap.max_recv_wr = recvDepth;
    a.cap.max_send_sge = 3;  // header, payload, trailer of a gathered frame
    a.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd_, &a);
    if (!qp) fail("ibv_create_qp", errno);
    return QueuePair{reinterpret_cast<uint64_t>(qp), qp->qp_num};
  }

  void toInit(const QueuePair& qp, uint8_t port) override {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = port;
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    modify(qp, attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
  }

  void toRtr(const QueuePair& qp, uint8_t port, const RemoteAddress& r, uint8_t gidIndex) override {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = mtuEnum(r.mtuBytes);
    attr.dest_qp_num = r.qpn;
    attr.rq_psn = r.psn;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;  // 0.64 ms before the sender retries a write that found no posted receive
    attr.ah_attr.dlid = r.lid;
    attr.ah_attr.sl = 0;
    attr.ah_attr.port_num = port;
    if (r.global) {
      attr.ah_attr.is_global = 1;
      std::memcpy(attr.ah_attr.grh.dgid.raw, r.gid.data(), 16);
      attr.ah_attr.grh.sgid_index = gidIndex;
      attr.ah_attr.grh.hop_limit = 64;
    }
    modify(qp, attr,
           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
               IBV_QP_MIN_RNR_TIMER,
           "RTR");
  }

  void toRts(const QueuePair& qp, uint32_t psn) override {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    attr.sq_psn = psn;
    attr.timeout = 14;  // 4.096 us * 2^14 = 67 ms per transport retry
    attr.retry_cnt = 7;
    attr.rnr_retry = 7;  // retry forever on "receiver not ready": the protocol's credits make it transient
    attr.max_rd_atomic = 1;
    modify(
        qp, attr,
        IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
        "RTS");
  }

  void destroyQp(const QueuePair& qp) noexcept override {
    if (qp.handle) ibv_destroy_qp(reinterpret_cast<ibv_qp*>(qp.handle));
  }

  void postWriteImm(const QueuePair& qp, uint64_t wrId, const Sge* sges, int count, uint64_t remoteAddr, uint32_t rkey,
                    uint32_t imm) override {
    ibv_sge sg[3];
    for (int i = 0; i < count && i < 3; ++i) sg[i] = ibv_sge{sges[i].addr, sges[i].length, sges[i].lkey};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = wrId;
    wr.sg_list = sg;
    wr.num_sge = std::min(count, 3);
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = remoteAddr;
    wr.wr.rdma.rkey = rkey;
    if (const int rc = ibv_post_send(reinterpret_cast<ibv_qp*>(qp.handle), &wr, &bad))
      fail("ibv_post_send (write)", rc);
  }

  void postSendImm(const QueuePair& qp, uint64_t wrId, uint32_t imm) override {
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = wrId;
    wr.num_sge = 0;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    if (const int rc = ibv_post_send(reinterpret_cast<ibv_qp*>(qp.handle), &wr, &bad))
      fail("ibv_post_send (credit)", rc);
  }

  void postRecv(const QueuePair& qp, uint64_t wrId) override {
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = wrId;
    wr.num_sge = 0;
    if (const int rc = ibv_post_recv(reinterpret_cast<ibv_qp*>(qp.handle), &wr, &bad)) fail("ibv_post_recv", rc);
  }

  std::size_t pollCq(Completion* out, std::size_t max) override {
    ibv_wc wc[32];
    const int n = ibv_poll_cq(cq_, static_cast<int>(std::min<std::size_t>(max, 32)), wc);
    if (n < 0) throw Error(ErrorCode::IoError, "ibv_poll_cq failed");
    for (int i = 0; i < n; ++i) {
      Completion& c = out[i];
      c.wrId = wc[i].wr_id;
      c.qpn = wc[i].qp_num;
      c.ok = wc[i].status == IBV_WC_SUCCESS;
      c.status = c.ok ? std::string() : ibv_wc_status_str(wc[i].status);
      c.imm = (wc[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0;
      // An error completion's opcode is undefined: leave it Other (the wr id says what it was).
      c.kind = CompletionKind::Other;
      if (c.ok) switch (wc[i].opcode) {
          case IBV_WC_RDMA_WRITE: c.kind = CompletionKind::WriteImm; break;
          case IBV_WC_SEND: c.kind = CompletionKind::SendImm; break;
          case IBV_WC_RECV_RDMA_WITH_IMM: c.kind = CompletionKind::RecvWriteImm; break;
          case IBV_WC_RECV: c.kind = CompletionKind::RecvSendImm; break;
          default: break;
        }
    }
    return static_cast<std::size_t>(n);
  }

 private:
  void modify(const QueuePair& qp, ibv_qp_attr& attr, int mask, const char* state) {
    if (const int rc = ibv_modify_qp(reinterpret_cast<ibv_qp*>(qp.handle), &attr, mask))
      fail(std::string("ibv_modify_qp(") + state + ")", rc);
  }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
};

}  // namespace

std::unique_ptr<VerbsApi> makeRealVerbs() { return std::make_unique<RealVerbs>(); }

}  // namespace mk::proxy::ib

// mkernel — shared segment and CUDA IPC handle caches of a multi-process communicator (process_link.hpp).
#include "engine/process_link.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "device/driver_api.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mk::runtime {
namespace {

constexpr uint32_t kSharedMagic = 0x4d4b5348u;  // "MKSH"
constexpr size_t kNameBytes = 64;

size_t roundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

/// What /proc/<pid>/stat says of a process: its start time (clock ticks after boot; a reused pid has another),
/// whether it is on its way out (a zombie, dead, or PF_EXITING: killed and tearing down), and whether it was read.
struct ProcStat {
  bool read = false;
  bool exiting = false;
  uint64_t startTicks = 0;
};

ProcStat procStat(int pid) {
  ProcStat st;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return st;
  const size_t close = line.rfind(')');  // the command name may hold spaces and parentheses
  if (close == std::string::npos) return st;
  std::istringstream rest(line.substr(close + 1));
  std::vector<std::string> fields(1);  // fields[i] is field i + 2 of proc(5): [1] state, [7] flags, [20] starttime
  for (std::string field; fields.size() <= 20 && rest >> field;) fields.push_back(field);
  if (fields.size() <= 20) return st;
  try {
    constexpr uint64_t kPfExiting = 0x4;  // PF_EXITING
    st.startTicks = std::stoull(fields[20]);
    st.exiting = fields[1] == "Z" || fields[1] == "X" || (std::stoull(fields[7]) & kPfExiting) != 0;
    st.read = true;
  } catch (...) {
  }
  return st;
}

std::string hexPtr(const void* p) {
  std::ostringstream os;
  os << p;
  return os.str();
}

}  // namespace

ProcessLink::ProcessLink(Bootstrap& boot, uint32_t ringSlots, int leader)
    : rank_(boot.rank()), size_(boot.size()), leader_(leader), ringSlots_(ringSlots) {
  if (size_ > static_cast<int>(device::kMaxRanks))
    throw Error(ErrorCode::Unsupported, "WORLD_SIZE " + std::to_string(size_) + ": the GPU engine drives at most " +
                                            std::to_string(device::kMaxRanks) + " ranks (one NVLink domain)");
  bytes_ = roundUp(sizeof(SharedHeader) + sizeof(OpPost) * size_t{ringSlots_} * static_cast<size_t>(size_), 4096);
  char name[kNameBytes] = {};
  int fd = -1;
  if (rank_ == leader_) {
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    std::snprintf(name, sizeof name, "/mkernel-%d-%llx", static_cast<int>(getpid()),
                  static_cast<unsigned long long>(now));
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
      throw Error(ErrorCode::IoError, std::string("cannot create the shared-memory segment ") + name + ": " +
                                          std::strerror(errno) + " (is /dev/shm mounted and writable?)");
    if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      const int err = errno;
      ::close(fd);
      shm_unlink(name);
      throw Error(ErrorCode::IoError, std::string("cannot size the shared-memory segment ") + name + " to " +
                                          std::to_string(bytes_) + " bytes: " + std::strerror(err));
    }
  }
  // Every rank learns the name (its leader's entry), maps it, and only then the leader unlinks it: the segment
  // disappears with the last process even when one of them is killed.
  std::vector<uint8_t> names;
  try {
    names = boot.allGather(name, sizeof name);
  } catch (...) {
    if (fd >= 0) {
      ::close(fd);
      shm_unlink(name);
    }
    throw;
  }
  std::memcpy(name, names.data() + static_cast<size_t>(leader_) * sizeof name, sizeof name);
  name[kNameBytes - 1] = '\0';
  if (rank_ != leader_) {
    fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0)
      throw Error(ErrorCode::IoError, std::string("rank ") + std::to_string(rank_) + " cannot open rank " +
                                          std::to_string(leader_) + "'s shared-memory segment " + name + ": " +
                                          std::strerror(errno) +
                                          " (the processes of one communicator must share a node and /dev/shm)");
  }
  void* m = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int mapErr = errno;
  ::close(fd);
  if (m == MAP_FAILED) {
    if (rank_ == leader_) shm_unlink(name);
    throw Error(ErrorCode::IoError,
                std::string("cannot map the shared-memory segment ") + name + ": " + std::strerror(mapErr));
  }
  base_ = m;
  header_ = static_cast<SharedHeader*>(m);
  posts_ = reinterpret_cast<OpPost*>(static_cast<char*>(m) + roundUp(sizeof(SharedHeader), 64));
  if (rank_ == leader_) {
    header_->magic = kSharedMagic;
    header_->nRanks = static_cast<uint32_t>(size_);
    header_->ringSlots = ringSlots_;
  }
  header_->pid[rank_] = static_cast<int32_t>(getpid());
  header_->startTicks[rank_] = procStat(static_cast<int>(getpid())).startTicks;
  try {
    boot.barrier();  // every rank mapped its node's segment (and the leader initialised the header)
  } catch (...) {
    if (rank_ == leader_) shm_unlink(name);
    munmap(base_, bytes_);
    base_ = nullptr;
    throw;
  }
  if (rank_ == leader_) shm_unlink(name);
  if (header_->magic != kSharedMagic || header_->nRanks != static_cast<uint32_t>(size_) ||
      header_->ringSlots != ringSlots_) {
    munmap(base_, bytes_);
    base_ = nullptr;
    throw Error(ErrorCode::InvalidArgument, "rank " + std::to_string(rank_) + ": rank " + std::to_string(leader_) +
                                                "'s shared segment describes " +
                                                std::to_string(header_ ? header_->nRanks : 0) + " ranks and " +
                                                std::to_string(header_ ? header_->ringSlots : 0) +
                                                " ring slots (every rank must use the same CommConfig::ringSlots)");
  }
  const cudaError_t e = cudaHostRegister(base_, bytes_, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    munmap(base_, bytes_);
    base_ = nullptr;
    throw Error(ErrorCode::CudaError,
                std::string("cudaHostRegister of the shared segment failed: ") + cudaGetErrorName(e));
  }
  registered_ = true;
  // Only processes this one sees as they saw themselves are watched: in another pid namespace a live peer would
  // look gone.
  watched_.assign(static_cast<size_t>(size_), false);
  for (int q = 0; q < size_; ++q)
    watched_[static_cast<size_t>(q)] = q != rank_ && header_->pid[q] > 0 && header_->startTicks[q] != 0 &&
                                       procStat(header_->pid[q]).startTicks == header_->startTicks[q];
  void* d = nullptr;
  MK_CUDA_CHECK(cudaHostGetDevicePointer(&d, base_, 0));
  statusDevice_ = &static_cast<SharedHeader*>(d)->status;
}

ProcessLink::~ProcessLink() {
  closeImports();
  if (registered_) cudaHostUnregister(base_);
  if (base_) munmap(base_, bytes_);
  cudaGetLastError();
}

bool ProcessLink::gone(int q) const {
  if (q < 0 || q >= size_ || !watched_[static_cast<size_t>(q)]) return false;
  if (__atomic_load_n(&header_->stopped[q], __ATOMIC_ACQUIRE) != 0) return false;  // left in order
  const ProcStat st = procStat(header_->pid[q]);
  return !st.read || st.startTicks != header_->startTicks[q] || st.exiting;
}

std::string ProcessLink::goneRanks() const {
  std::string out;
  for (int q = 0; q < size_; ++q)
    if (gone(q))
      out += (out.empty() ? "" : ", ") + std::string("rank ") + std::to_string(q) + " (pid " +
             std::to_string(header_->pid[q]) + ")";
  return out;
}

OpPost& ProcessLink::post(uint32_t seq, int q) noexcept {
  return posts_[size_t{seq % ringSlots_} * static_cast<size_t>(size_) + static_cast<size_t>(q)];
}

IpcRef ProcessLink::exportPointer(const void* p, const std::string& what) {
  IpcRef ref{};
  if (!p) return ref;
  const auto& api = driverApi();
  unsigned long long id = 0;
  const auto dp = reinterpret_cast<CUdeviceptr>(p);
  checkDriver(api.pointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, dp), "cuPointerGetAttribute (buffer id)");
  auto it = exports_.find(id);
  if (it == exports_.end()) {
    CUdeviceptr base = 0;
    size_t size = 0;
    checkDriver(api.memGetAddressRange(&base, &size, dp), "cuMemGetAddressRange");
    Export ex{};
    const cudaError_t e = cudaIpcGetMemHandle(&ex.handle, reinterpret_cast<void*>(base));
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error(ErrorCode::InvalidArgument,
                  what + " " + hexPtr(p) +
                      " cannot be shared with the other processes (cudaIpcGetMemHandle: " + cudaGetErrorName(e) +
                      "): in multi-process mode buffers must come from cudaMalloc (memory of stream-ordered pools "
                      "and of cuMemCreate is not exportable this way)");
    }
    ex.base = static_cast<uintptr_t>(base);
    ex.size = size;
    it = exports_.emplace(id, ex).first;
  }
  ref.handle = it->second.handle;
  ref.bufferId = id;
  ref.offset = reinterpret_cast<uintptr_t>(p) - it->second.base;
  return ref;
}

void* ProcessLink::importPointer(int q, const IpcRef& ref) {
  if (ref.bufferId == 0) return nullptr;
  const auto key = std::make_pair(q, ref.bufferId);
  auto it = imports_.find(key);
  if (it == imports_.end()) {
    void* mapped = nullptr;
    cudaIpcMemHandle_t h = ref.handle;
    const cudaError_t e = cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error(ErrorCode::CudaError, "rank " + std::to_string(rank_) + " cannot map memory of rank " +
                                            std::to_string(q) + " (cudaIpcOpenMemHandle: " + cudaGetErrorName(e) +
                                            "): are both GPUs of this node, with peer access between them?");
    }
    it = imports_.emplace(key, mapped).first;
  }
  return static_cast<char*>(it->second) + ref.offset;
}

void ProcessLink::closeImports() noexcept {
  for (auto& kv : imports_) cudaIpcCloseMemHandle(kv.second);
  imports_.clear();
  cudaGetLastError();
}

}  // namespace mk::runtime

// mkernel — bootstrap of a communicator spread over processes: who is who, and an all-gather to exchange
// what the engine shares once at creation (memory handles, device identities, a shared-memory name).
//
// One process per GPU or per node (the inter-node transports of mk/proxy/ connect through it). The processes find each
// other through torchrun-style variables RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT (TCP
// rendezvous at MASTER_ADDR:MASTER_PORT, run by rank 0); under mpirun the rank, size and local rank may
// come from Open MPI's or PMI's variables instead (OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK, PMI_RANK /
// PMI_SIZE); MASTER_ADDR / MASTER_PORT are still needed (`mpirun -x MASTER_ADDR=... -x MASTER_PORT=...`).
// Under torchrun (TORCHELASTIC_RUN_ID set) the agent's own store listens on MASTER_PORT, so rank 0 listens
// on MASTER_PORT + 1. A build with MPI (libopenmpi-dev) bootstraps a process started by mpirun without
// MASTER_ADDR through MPI instead (makeMpiBootstrap, preferMpiBootstrap).
//
// The TCP rendezvous admits only processes that hold the job's key (mk/job_key.hpp: MK_JOB_KEY or MK_JOB_KEY_FILE,
// given by the launcher): each connection proves it by an HMAC over fresh nonces, both ways, before it is told
// anything. A connection that fails (a stranger, a port scanner, a process of another job, a silent or half-open
// socket) is logged and closed, and the rendezvous goes on. Threat model: docs/inter-node.md, "Who may join a job".
//
// Every operation is collective (every rank calls it, in the same order) and bounded: a rank that never
// arrives, an address that refuses, a peer that dies mid-exchange end in mk::Error naming the rank or the
// address, never in a hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mk/job_key.hpp"

namespace mk {

/// Rank, size and rendezvous of this process, read from the environment (see readLaunchEnvironment).
struct LaunchEnvironment {
  int rank = 0;             ///< RANK (or OMPI_COMM_WORLD_RANK / PMI_RANK)
  int size = 1;             ///< WORLD_SIZE (or OMPI_COMM_WORLD_SIZE / PMI_SIZE)
  int localRank = 0;        ///< LOCAL_RANK (or OMPI_COMM_WORLD_LOCAL_RANK; else = rank): picks the GPU
  std::string masterAddr;   ///< MASTER_ADDR: host name or IPv4 address rank 0 listens on
  uint16_t masterPort = 0;  ///< MASTER_PORT (1..65535); MASTER_PORT + 1 under torchrun (TORCHELASTIC_RUN_ID set),
                            ///< whose agent serves its own store on MASTER_PORT
  JobKey jobKey;            ///< MK_JOB_KEY or MK_JOB_KEY_FILE (readJobKey); required when size > 1
};

/// True when the environment describes a multi-process launch (RANK / WORLD_SIZE or their MPI equivalents
/// are set).
bool launchedAsRanks();

/// This process's node rank, which picks its GPU: LOCAL_RANK (or OMPI_COMM_WORLD_LOCAL_RANK / MPI_LOCALRANKID),
/// else its rank (RANK / OMPI_COMM_WORLD_RANK / PMI_RANK), else 0. Needs no rendezvous variables, so a process
/// started by mpirun can pick its GPU before the MPI bootstrap. Throws Error(InvalidArgument) naming a
/// malformed variable.
int launchLocalRank();

/// Read the launch variables. Throws Error(InvalidArgument) naming the variable that is missing or
/// malformed (not an integer, rank outside 0..size-1, port outside 1..65535, a job of several processes without a
/// job key, ...).
LaunchEnvironment readLaunchEnvironment();

/// Who is who among the processes of one communicator, and a collective byte exchange.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  /// This process's rank, 0..size()-1.
  virtual int rank() const noexcept = 0;
  /// Number of processes.
  virtual int size() const noexcept = 0;
  /// Every rank passes `bytes` bytes (the same count on every rank); returns size() * bytes bytes, rank
  /// q's contribution at q * bytes. Bounded; throws Error(Timeout / IoError) naming the rank at fault.
  virtual std::vector<uint8_t> allGather(const void* mine, size_t bytes) = 0;
  /// Returns once every rank has called it (bounded like allGather).
  virtual void barrier() = 0;
};

/// Options of the TCP rendezvous.
struct TcpBootstrapOptions {
  int rank = 0;
  int size = 1;
  std::string addr = "127.0.0.1";  ///< where rank 0 listens and every other rank connects
  uint16_t port = 0;               ///< 1..65535
  double timeoutMs = 30000;        ///< budget of the rendezvous and of each later collective call
  JobKey key;                      ///< the job's key; required when size > 1 (every rank the same)
  double handshakeMs = 2000;       ///< budget of one connection's handshake: a silent or half-open one is dropped
  /// Where a refused connection is reported (one line each, "bootstrap: rank 0 refused a connection from ...");
  /// empty: standard error. After 16 lines further refusals are counted, not printed.
  std::function<void(const std::string&)> log;
};

/// Star topology over TCP: rank 0 listens on addr:port and accepts size - 1 authenticated connections (each proves
/// it holds the job key and says who it is; rank 0 proves the same back); the others connect (retrying until rank 0
/// listens or the budget is spent). A connection that fails the handshake is logged, closed and otherwise ignored:
/// it cannot take a rank, learn anything the job shares, or end the rendezvous. allGather: every rank
/// sends its bytes to rank 0, which answers with the concatenation. The connections stay open for the
/// communicator's life (barrier at destruction); a peer that dies shows up as a closed connection.
class TcpBootstrap final : public Bootstrap {
 public:
  /// Rendezvous now. Throws Error(InvalidArgument) for bad options (no key for a job of several processes
  /// included), for a rank 0 that refused this process's key, and for authenticated processes that disagree on
  /// WORLD_SIZE or claim one rank twice; Error(Timeout) naming the ranks that never connected and the connections
  /// refused meanwhile (rank 0) or the address that never accepted (others); Error(IoError) for socket failures
  /// (address in use, unknown host, ...).
  explicit TcpBootstrap(const TcpBootstrapOptions& options);
  /// From readLaunchEnvironment(), with `timeoutMs` as the budget.
  static std::unique_ptr<TcpBootstrap> fromEnvironment(double timeoutMs = 30000);
  ~TcpBootstrap() override;
  TcpBootstrap(const TcpBootstrap&) = delete;
  TcpBootstrap& operator=(const TcpBootstrap&) = delete;

  int rank() const noexcept override { return opt_.rank; }
  int size() const noexcept override { return opt_.size; }
  std::vector<uint8_t> allGather(const void* mine, size_t bytes) override;
  void barrier() override;
  /// Budget of each later collective call (ms).
  void setTimeoutMs(double ms) { opt_.timeoutMs = ms; }
  /// Connections rank 0 refused during the rendezvous (0 on other ranks).
  std::size_t refusedConnections() const noexcept { return refused_; }

 private:
  void rendezvousRoot();
  void rendezvousPeer();

  TcpBootstrapOptions opt_;
  std::vector<int> peers_;  ///< rank 0: socket of rank q at [q] (-1 for itself); others: [0] = socket to rank 0
  uint32_t calls_ = 0;      ///< collective calls so far (checked on both sides: catches mismatched call orders)
  std::size_t refused_ = 0;
};

/// True when this build has the MPI bootstrap (MPI found at configure time, MK_WITH_MPI not OFF).
bool mpiBootstrapBuilt() noexcept;

/// True when Communicator::createFromEnvironment bootstraps through MPI: built with MPI, started by mpirun
/// (OMPI_COMM_WORLD_SIZE or PMI_SIZE set) and MASTER_ADDR not set (setting it keeps the TCP rendezvous).
bool preferMpiBootstrap() noexcept;

/// Bootstrap over a duplicate of MPI_COMM_WORLD (every process of the MPI job is a rank, in its world order).
/// Initialises MPI (MPI_Init_thread, MPI_THREAD_SERIALIZED requested) when the program has not, and then
/// finalises it at exit; MPI initialised by the program is left to the program. Creation (MPI_Comm_idup),
/// allGather (MPI_Iallgather) and barrier (MPI_Ibarrier) are polled with MPI_Test against `timeoutMs`: a
/// rank that never calls ends in Error(Timeout) on the others, after which that bootstrap is unusable
/// (Error(InvalidArgument) on each later call). allGather also checks that every rank passed the same byte
/// count at the same call. `localRank` (if not null) receives the rank among the processes of this node
/// (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED): the GPU to use. MPI_Init_thread itself cannot be bounded.
/// Throws Error(Unsupported) in a build without MPI, Error(InvalidArgument) for a budget that is not a
/// positive number or after MPI_Finalize, Error(IoError) when an MPI call fails.
std::unique_ptr<Bootstrap> makeMpiBootstrap(double timeoutMs, int* localRank = nullptr);

/// A process started as one rank (torchrun, mpirun): its rendezvous with the other ranks and its GPU.
struct RankLaunch {
  std::unique_ptr<Bootstrap> bootstrap;
  int device = 0;  ///< the process's rank on its node, which picks the GPU it drives
};

/// The one choice of rendezvous and GPU for a process started as one rank (launchedAsRanks());
/// Communicator::createFromEnvironment and mk-bench use it. Started by mpirun without MASTER_ADDR in a build
/// with MPI (preferMpiBootstrap()): the MPI bootstrap, the node rank from MPI. Otherwise the TCP rendezvous of
/// readLaunchEnvironment(), the node rank LOCAL_RANK. `timeoutMs` budgets the rendezvous. The node rank is
/// checked against the GPUs this process sees before the TCP rendezvous starts. Throws Error(Unsupported) when
/// no CUDA device is usable, Error(InvalidArgument) for a node rank beyond them or a missing / malformed launch
/// variable, and what the bootstrap throws. Part of mk::impl (the CUDA engine): the rest of this header is mk::host.
RankLaunch bootstrapFromEnvironment(double timeoutMs);

}  // namespace mk

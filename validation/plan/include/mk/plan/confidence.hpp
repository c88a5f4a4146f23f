// mkernel — how far each predicted number can be trusted (docs/planner.md, "Confidence").
//
// Every number of a plan is built from classes of operations: GEMMs, attention kernels, collectives inside a node
// or across nodes, and the step model's composition (overlap, pipeline bubble). A class measured by this project
// carries the error of its model against the committed measurements (validation/data/measured):
//   * GEMMs: the GEMM model's leave-one-shape-out error on the cuBLAS records;
//   * collectives inside a node: the simulator's error on the committed records of this project's engine
//     (mk-validate's comparison, run on the plan's own profile);
//   * the fused operators: the simulator's error on the committed fused records across nodes (mk-validate
//     --fused-nodes), extrapolated wherever a plan uses it (they ran with ranks sharing one GPU over loopback TCP);
// a class nothing measured is "not validated". A use of a measured class outside what was measured (another GPU
// model, more ranks) is "extrapolated" and says what was measured.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mk/plan/gemm_model.hpp"
#include "mk/plan/kernel_model.hpp"
#include "mk/plan/pricer.hpp"
#include "mk/validation/validate.hpp"
#include "mk/validation/validate_fused_nodes.hpp"
#include "mk/validation/validate_layered.hpp"

namespace mk::plan {

/// How a number relates to measurements.
enum class Status : uint8_t {
  Validated,     ///< the class and its regime were measured: the error applies
  Extrapolated,  ///< the class was measured, but not in this regime (GPU model, rank count)
  NotValidated,  ///< nothing measured covers it
  NotAvailable,  ///< not computed in this build
};
const char* toString(Status s) noexcept;  ///< "validated", "extrapolated", "not validated", "not available"

/// One class of operations and what was measured of it.
struct ConfidenceClass {
  std::string id;    ///< "compute.gemm", "comm.nvlink.allreduce", "comm.network.allgather", "model.pipeline", ...
  std::string what;  ///< one line for people
  std::optional<ErrorStats> error;      ///< |predicted - measured| / measured, percent
  std::string method;                   ///< how the error was obtained (or why there is none)
  std::string measuredGpu;              ///< GPU model of the measurements ("" when none)
  std::vector<uint32_t> measuredRanks;  ///< rank counts measured (collectives)
  /// Kernel classes: the leave-one-shape-out error on each GPU model with records (`error` is the plan's GPU's
  /// when it has records, else the first one's).
  std::map<std::string, ErrorStats> errorByGpu;
  /// Where the error was measured when no use of the class is in that regime (the fused operators: ranks sharing
  /// one GPU over loopback TCP, never NVLink): every use is extrapolated and says this. "" when uses can match.
  std::string regime;
};

/// The confidence of one use of a class.
struct UseConfidence {
  std::string classId;
  Status status = Status::NotValidated;
  std::string note;  ///< what makes it extrapolated or not validated
};

/// Every class of a plan.
class ConfidenceTable {
 public:
  void add(ConfidenceClass c);
  const std::map<std::string, ConfidenceClass>& classes() const noexcept { return classes_; }
  /// A compute kernel of `kind` on GPU model `gpu`.
  UseConfidence forCompute(ComputeKind kind, const std::string& gpu) const;
  /// A kernel of class `cls` on `gpu`: forCompute for GEMMs and attention, "compute.<class>" (not validated,
  /// "roofline: unmeasured") for the others.
  UseConfidence forKernelClass(KernelClass cls, const std::string& gpu) const;
  /// A collective `op` ("allreduce", ..., "sendrecv") inside a node or across nodes (`domain`) of `groupSize`
  /// ranks on `gpu`: the class "comm.<domain>.<op>".
  UseConfidence forComm(CommDomain domain, const std::string& op, uint32_t groupSize, const std::string& gpu) const;
  /// A class without a regime (the step model's composition: "model.pipeline", "model.overlap"), or one measured
  /// only in a regime of its own (ConfidenceClass::regime: extrapolated, the note says where it was measured).
  UseConfidence forClass(const std::string& id) const;

 private:
  std::map<std::string, ConfidenceClass> classes_;
};

/// The table for a plan: the GEMM model (null: no GEMM records), the kernel models (null: none; a class with
/// kernel records carries their leave-one-shape-out error per GPU, `planGpu`'s first), the simulator's validation
/// rows on the committed collectives of our engine (null: none could be run, `why` says so), and the layered
/// model's rows on the committed `impl: nccl` records (null: none). A plan's collectives are the layered
/// baseline's (NCCL, the nccl-* family): their classes (comm.*) carry the layered model's error; our engine's
/// error is its own class (engine.*), for what our engine runs (the fused operators). The class "fused" carries the
/// error of the fused records across nodes (`fusedNodes`: the chain of each committed manifest, pooled) in
/// the regime they measured; without them (null or empty) it says where the fused operators were validated.
ConfidenceTable buildConfidence(const GemmModel* gemm, const ValidationResult* validation,
                                const std::string& validationGpu, const std::string& why,
                                const KernelModels* kernels = nullptr, const std::string& planGpu = "",
                                const LayeredValidation* layered = nullptr,
                                const std::vector<FusedNodesValidation>* fusedNodes = nullptr);

}  // namespace mk::plan

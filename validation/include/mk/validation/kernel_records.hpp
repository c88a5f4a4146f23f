// mkernel — the kernel records of a measurement file (issue 32: op "kernel", written by
// validation/tools/kernel_bench.py; docs/calibration.md, "Kernel measurements"), read and checked against the
// kernel census's contract: its classes, dtypes, passes and each class's shape fields.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mk/io/measurement.hpp"
#include "mk/workload/lowering.hpp"

namespace mk {

/// One measured kernel, as the census names it.
struct KernelRecord {
  KernelClass cls = KernelClass::Gemm;
  std::string kernel;  ///< the contract's kernel name ("qkv", "rmsnorm", "attention.bwd", ...)
  Pass pass = Pass::Forward;
  std::string dtype;  ///< "bfloat16", "float16", "float32" or "float8_e4m3"
  std::string shape;  ///< the class's shape fields, "m=2048 n=6144 k=4096 batch=1": one measured shape
  uint64_t m = 0, n = 0, k = 0, batch = 1;  ///< GEMMs only
  bool accumulateFp32 = false;              ///< a GEMM adding into an fp32 output ("accumulate": "float32")
  uint64_t vocab = 0;                       ///< loss and embedding records: the row the kernel works on
  uint64_t tokens = 0;                      ///< the records of classes with a tokens field: the rows
  double flops = 0, bytes = 0, timeUs = 0;
  std::string gpu;        ///< the file's system.gpu as written ("NVIDIA H100 80GB HBM3")
  std::string file;       ///< the name it was read under
  std::size_t index = 0;  ///< records[index] of that file
};

/// The shape fields a record of `cls` must carry (the census contract's table).
const std::vector<const char*>& kernelShapeFields(KernelClass cls);

/// The records with op "kernel" of `file` (read under `name`), checked: a class, dtype or pass the census does not
/// know, a missing or non-positive shape field, a missing flops / bytes throws Error(InvalidArgument) naming the
/// file, the record and the field ("x.json: records[3].hidden: missing (a norm record needs tokens, hidden)").
std::vector<KernelRecord> kernelRecords(const MeasurementFile& file, const std::string& name);

}  // namespace mk

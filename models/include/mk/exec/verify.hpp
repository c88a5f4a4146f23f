// mkernel — run a generated collective on the CPU executor against a plain reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/exec/executor.hpp"

namespace mk {

/// How inputs are drawn.
enum class InputKind : uint8_t {
  SmallIntegers,  ///< integers in [-8, 8]: every summation order is exact, so results must be bit-exact
  Uniform,        ///< uniform in [-1, 1): results within the documented summation error bound
};

/// Plain reference: outputs[rank] (as float) of `spec` given inputs[rank] (as float, already rounded to
/// the dtype). Sums in rank order 0..n-1 in double, rounded once to the dtype.
std::vector<std::vector<float>> referenceCollective(const CollectiveSpec& spec, uint32_t nRanks,
                                                    const std::vector<std::vector<float>>& inputs);

struct VerifyResult {
  bool ok = false;
  uint64_t checked = 0;  ///< elements compared
  std::string detail;    ///< first mismatch: "rank 2 output[1031]: got 3.5 expected 4 (tol 0)" or "OK"
  /// Largest |got - expected| seen relative to its tolerance (<= 1 passes).
  double worstRatio = 0;
};

/// Fill fresh random inputs (seeded), execute `s` (generated for `spec`), compare every output element of
/// every rank with referenceCollective(). Tolerance: 0 for SmallIntegers and for max/min; for Uniform
/// sums (n-1) * u * sum|x| with u the dtype's unit roundoff plus one final rounding (docs/architecture.md).
/// With opt.localRanks (a run that spans processes) this process fills and checks those ranks only; every process
/// draws the same inputs from `seed`, and all-reduce outputs are compared bit for bit among the local ranks.
VerifyResult verifyCollective(const Schedule& s, const CollectiveSpec& spec, uint64_t seed,
                              InputKind kind = InputKind::Uniform, const ExecOptions& opt = {});

}  // namespace mk

// mkernel — what the attention forward engine (mk/device/attention_device.hpp) can run and the parameters it loops
// over, without CUDA: the standalone launcher (mk/attention.hpp) and the lowering of Attention steps into the resident
// kernel's compute lanes both ask here, so both refuse the same shapes with the same words.
#pragma once

#include <cstdint>
#include <string>

#include "mk/device/attention_device.hpp"
#include "mk/schedule/attention.hpp"
#include "mk/schedule/element.hpp"

namespace mk {

/// Why the device engine cannot run `sh` with inputs of `dtype` ("" when it can): attentionShapeProblem's reasons,
/// then a head dim other than 64 or 128, an input dtype other than bf16, V not 16-byte aligned (vOffset a
/// multiple of 8), a size TMA cannot address, positions past 2^62. Each names the argument. No GPU needed.
std::string attentionForwardProblem(const AttentionShape& sh, DType dtype);

/// The engine's parameters for `sh` without the tensor maps (sizes, unit count, mask, scale): what attentionForward
/// fills before encoding the maps; the tests check the unit and mask arithmetic with it. `sh` must pass
/// attentionForwardProblem.
device::AttentionParams attentionWorkParams(const AttentionShape& sh);

}  // namespace mk

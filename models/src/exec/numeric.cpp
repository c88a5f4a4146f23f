// placeholder (being written): link stubs
#include "mk/exec/numeric.hpp"
namespace mk {
uint16_t floatToBf16(float) noexcept { return 0; }
float bf16ToFloat(uint16_t) noexcept { return 0; }
uint16_t floatToHalf(float) noexcept { return 0; }
float halfToFloat(uint16_t) noexcept { return 0; }
float loadElement(DType, const void*, uint64_t) noexcept { return 0; }
void storeElement(DType, void*, uint64_t, float) noexcept {}
float applyRedOp(RedOp, float a, float) noexcept { return a; }
}

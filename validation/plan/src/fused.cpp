// mkernel — the fused operators' pricer of this build (fused.hpp): none is linked yet.
#include "mk/plan/fused.hpp"

#include "mk/error.hpp"

namespace mk::plan {

namespace {

/// No fused-operator model in this build: the planner must say so, never invent a number.
class UnavailableFusedPricer final : public FusedOpPricer {
 public:
  bool available() const override { return false; }
  std::string unavailableReason() const override {
    return "not available in this build (the fused operators' cost model is not linked into mk-plan)";
  }
  FusedOpPrice price(const FusedOpRequest&) override {
    throw Error(ErrorCode::Unsupported, "fused: " + unavailableReason());
  }
};

}  // namespace

std::unique_ptr<FusedOpPricer> makeFusedOpPricer() { return std::make_unique<UnavailableFusedPricer>(); }

}  // namespace mk::plan

// placeholder (being written): link stubs
#include "mk/schedule/validate.hpp"
#include "mk/error.hpp"
namespace mk {
std::vector<ValidationIssue> validateAll(const Schedule&, const ValidateOptions&) { return {}; }
void validate(const Schedule&, const ValidateOptions&) {}
}

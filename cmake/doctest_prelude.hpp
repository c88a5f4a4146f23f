// Force-included before every test source (see MkTesting.cmake).
//
// mkernel names its enums with mk::toString(enum) -> const char*. doctest stringifies operands with an
// unqualified toString(x), so ADL picks ours and the expression no longer concatenates. Routing doctest's
// stringification through this function keeps doctest's own overloads for everything else and prints
// mkernel enums by name.
#pragma once
#include <type_traits>
#include <utility>

namespace doctest {
class String;
}
template <class T>
doctest::String mkDoctestStringify(const T& value);
#define DOCTEST_STRINGIFY(...) mkDoctestStringify(__VA_ARGS__)

#include <doctest/doctest.h>

namespace mk_doctest_detail {
template <class T, class = void>
struct HasName : std::false_type {};
template <class T>
struct HasName<T, std::void_t<decltype(toString(std::declval<T>()))>> : std::true_type {};
}  // namespace mk_doctest_detail

template <class T>
doctest::String mkDoctestStringify(const T& value) {
  if constexpr (std::is_enum_v<T>) {
    if constexpr (mk_doctest_detail::HasName<T>::value) {
      return doctest::String(toString(value));
    } else {
      return doctest::toString(static_cast<std::underlying_type_t<T>>(value));
    }
  } else {
    return doctest::toString(value);
  }
}

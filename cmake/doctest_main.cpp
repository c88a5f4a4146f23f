// doctest's implementation and main(), compiled once (the mk_doctest_main object library, MkTesting.cmake) and
// linked into every CPU test binary. With the forced prelude (cmake/doctest_prelude.hpp) doctest.h is already
// included once: define both macros so this re-inclusion compiles the implementation and main().
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

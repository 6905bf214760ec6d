// The target that precompiles GoogleTest's header for every test binary (tests/CMakeLists.txt,
// ZT_TEST_PCH). It holds one test so that it links and runs like the others; ctest does not run it.
#include <gtest/gtest.h>

TEST(Pch, Builds) { SUCCEED(); }

// A scenario's expect patterns are bounded (issue 29): what std::regex would overflow its stack on
// (20,000 nested groups), expand without end, read past an int ({99999999999}, \5555555555) or
// backtrack on for ever ((a|a)*b) is refused or matched in linear time.
#include <gtest/gtest.h>

#include <chrono>

#include "pattern.h"

using namespace zt::repro;

TEST(Pattern, OrdinaryPatternsCompileAndMatch) {
  EXPECT_EQ(pattern_problem("Expected all tensors to be on the same device, but found at least two devices, cuda:\\d+ and cpu!"), "");
  EXPECT_EQ(pattern_problem("fp32_partitioned_groups_flat\\[\\d+\\]\\.grad@cpu"), "");
  EXPECT_EQ(pattern_problem("a{2,4}[)(]"), "");
  EXPECT_TRUE(pattern_search("cuda:\\d+ and cpu", "found cuda:3 and cpu!"));
  EXPECT_FALSE(pattern_search("cuda:\\d+ and cpu", "found cuda: and cpu!"));
}

TEST(Pattern, WhatStdRegexCannotTakeIsRefused) {
  EXPECT_NE(pattern_problem(std::string(20000, '(') + std::string(20000, ')')).find("characters long"), std::string::npos);
  EXPECT_NE(pattern_problem(std::string(40, '(') + std::string(40, ')')).find("nests groups 40 deep; at most 32"),
            std::string::npos);
  EXPECT_EQ(pattern_problem(std::string(32, '(') + std::string(32, ')')), "");
  EXPECT_NE(pattern_problem("(a)\\5555555555555555555").find("more than 4 digits"), std::string::npos);
  EXPECT_NE(pattern_problem("a{99999999999}").find("more than 4 digits"), std::string::npos);
  EXPECT_NE(pattern_problem("a{1,99999}").find("more than 4 digits"), std::string::npos);
  EXPECT_NE(pattern_problem("(a)\\1").find("not a regular expression"), std::string::npos);  // back-references
  EXPECT_NE(pattern_problem("(x{1000}){1000}").find("not a regular expression"), std::string::npos);  // > 100,000 states
  EXPECT_NE(pattern_problem("(").find("not a regular expression"), std::string::npos);
}

TEST(Pattern, NoBacktrackingForEver) {
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(pattern_search("(a|a)*b", std::string(40, 'a')));  // 2^40 paths for a backtracking matcher
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

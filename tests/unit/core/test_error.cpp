// mt::Error messages and exit codes.
#include <gtest/gtest.h>

#include "core/error.h"

TEST(Error, WhatAndWhyJoinAndCarryExitCodes) {
  const mt::UsageError usage("--seq-length 0", "must be positive");
  EXPECT_STREQ(usage.what(), "--seq-length 0: must be positive");
  EXPECT_EQ(usage.code(), mt::ExitCode::usage);
  EXPECT_EQ(static_cast<int>(mt::CheckFailed("a", "b").code()), 3);
  EXPECT_EQ(static_cast<int>(mt::StoppedResumable("a", "b").code()), 75);
  EXPECT_EQ(static_cast<int>(mt::Error("a", "b").code()), 1);
  EXPECT_STREQ(mt::Error("only what", "").what(), "only what");
}

// The output policy (io/output_policy.h, issue 28 L2): the same file under another spelling or a
// hard link is recognised, an input is refused as an output naming its flag, and an existing
// output is refused unless it is the run's own earlier output or --force.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../error_text.h"
#include "../temp_dir.h"
#include "io/output_policy.h"

using namespace mt;

TEST(OutputPolicy, SameFileSeesLinksAndSpellings) {
  mt::testing::TempDir dir("mt_test_output_policy");
  const std::string data = dir.file("data.txt");
  std::ofstream(data) << "text";
  ASSERT_EQ(::link(data.c_str(), dir.file("link.txt").c_str()), 0);
  EXPECT_TRUE(io::same_file(data, dir.file("link.txt")));
  EXPECT_TRUE(io::same_file(data, (dir.path() / "." / "data.txt").string()));
  EXPECT_FALSE(io::same_file(data, dir.file("other.txt")));
  EXPECT_TRUE(io::same_file(dir.file("new/a.h5"), dir.file("new/../new/a.h5")));  // neither exists yet
}

TEST(OutputPolicy, L2AnInputIsNeverAnOutput) {
  mt::testing::TempDir dir("mt_test_output_policy");
  const std::string data = dir.file("tiny.txt");
  std::ofstream(data) << "text";
  const std::string error = mt::testing::error_text(
      [&] { io::refuse_input_as_output("--save-init", data, {{"--load", dir.file("ck.h5")}, {"--byte-data", data}}); });
  EXPECT_NE(error.find("--save-init " + data + ": is this run's input (--byte-data " + data + ")"), std::string::npos)
      << error;
  EXPECT_EQ(mt::testing::error_text([&] { io::refuse_input_as_output("--save-init", dir.file("x.h5"), {{"--byte-data", data}}); }),
            "");
}

TEST(OutputPolicy, L2AnExistingOutputNeedsForceUnlessItIsTheRunsOwn) {
  mt::testing::TempDir dir("mt_test_output_policy");
  const std::string existing = dir.file("some.jsonl");
  std::ofstream(existing) << "{}";
  const std::string error = mt::testing::error_text([&] { io::refuse_existing_output("--save-final", existing, false, false); });
  EXPECT_NE(error.find("--save-final " + existing + ": exists and is not this run's output; give --force"), std::string::npos)
      << error;
  EXPECT_EQ(mt::testing::error_text([&] { io::refuse_existing_output("--save-final", existing, true, false); }), "");
  EXPECT_EQ(mt::testing::error_text([&] { io::refuse_existing_output("--save-final", existing, false, true); }), "");
  EXPECT_EQ(mt::testing::error_text([&] { io::refuse_existing_output("--save-final", dir.file("new.h5"), false, false); }), "");
}

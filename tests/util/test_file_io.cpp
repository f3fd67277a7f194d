// Atomic file replacement: the new content or the old, never a partial file.
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_support.h"
#include "util/file_io.h"

namespace depcache {
namespace DEPCACHE_TEST_FILE {

using test::slurp;

TEST(FileIo, WritesAndReplacesWithoutLeavingAPartialFile) {
  const auto dir = test::temp_path("file-io");
  std::filesystem::create_directories(dir);
  const auto path = dir / "out.bin";
  EXPECT_FALSE(write_file_atomic(path, "first").has_value());
  EXPECT_EQ(slurp(path), "first");
  EXPECT_FALSE(write_file_atomic(path, std::string(100000, 'x')).has_value());
  EXPECT_EQ(slurp(path), std::string(100000, 'x'));
  EXPECT_FALSE(std::filesystem::exists(dir / "out.bin.partial"));
  std::filesystem::remove_all(dir);
}

TEST(FileIo, FailuresSayWhereAndLeaveNothing) {
  const auto dir = test::temp_path("file-io");
  const auto failure = write_file_atomic(dir / "missing" / "out.bin", "x");
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->stage, WriteFailure::Stage::Open);
  EXPECT_EQ(failure->error, ENOENT);
  EXPECT_NE(failure->message.find("out.bin.partial"), std::string::npos) << failure->message;
  // A directory in the way of the rename: the partial file is removed again.
  std::filesystem::create_directories(dir / "taken" / "inside");
  const auto blocked = write_file_atomic(dir / "taken", "x");
  ASSERT_TRUE(blocked.has_value());
  EXPECT_EQ(blocked->stage, WriteFailure::Stage::Rename);
  EXPECT_FALSE(std::filesystem::exists(dir / "taken.partial"));
  std::filesystem::remove_all(dir);
}

}  // namespace DEPCACHE_TEST_FILE
}  // namespace depcache

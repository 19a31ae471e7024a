// Reading whole files and checking output paths before the work that fills them.
#include "core/file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

using testing::expectThrowWith;

TEST(FileTest, ReadFileReturnsTheBytesOrNamesTheFile) {
  const std::string path = ::testing::TempDir() + "/file_test_read.bin";
  std::ofstream(path, std::ios::binary) << std::string("a\0b", 3);
  EXPECT_EQ(readFile(path, "thing"), std::string("a\0b", 3));
  expectThrowWith<IoError>([] { readFile("/nonexistent/x", "thing"); },
                           {"cannot open thing '/nonexistent/x'"});
}

TEST(FileTest, CheckWritableRefusesPathsThatCannotBeWritten) {
  const std::string dir = ::testing::TempDir() + "/file_test_dir";
  std::filesystem::create_directories(dir);
  checkWritable(dir + "/out.tdm", "model file");    // a new file in a directory that exists
  checkWritable("relative-out.tdm", "model file");  // the working directory
  expectThrowWith<IoError>([] { checkWritable("/nonexistent/dir/x.tdm", "model file"); },
                           {"cannot write model file '/nonexistent/dir/x.tdm'",
                            "directory '/nonexistent/dir' does not exist"});
  expectThrowWith<IoError>([&] { checkWritable(dir, "plan"); },
                           {"cannot write plan", "it is a directory"});
  const std::string file = dir + "/plain";
  std::ofstream(file) << "x";
  expectThrowWith<IoError>([&] { checkWritable(file + "/x.json", "profile"); },
                           {"is not a directory"});
  expectThrowWith<IoError>([] { checkWritable("", "profile"); }, {"no path"});
}

TEST(FileTest, WriteFileAtomicallyReplacesTheFileAndLeavesNoTemporary) {
  const std::string dir = testing::freshDir("atomic");
  const std::string path = dir + "/out.bin";
  const std::vector<uint8_t> first = {1, 2, 3}, second = {9};
  writeFileAtomically(path, first, "test file");
  EXPECT_EQ(readFile(path, "test file"), std::string("\x01\x02\x03"));
  writeFileAtomically(path, second, "test file");
  EXPECT_EQ(readFile(path, "test file"), std::string("\x09"));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  expectThrowWith<IoError>([&] { writeFileAtomically(dir + "/no/such/dir/x", first, "test file"); },
                           {"cannot write test file", "/no/such/dir/x.tmp"});
}

}  // namespace
}  // namespace tandem

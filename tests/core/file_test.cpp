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

}  // namespace
}  // namespace tandem

// Reading whole files and checking output paths before the work that fills them.
#include "core/file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

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

// Pieces from memory and extents of another file, copied by the kernel or read and
// written: the same bytes either way, in order; an extent past the source's end is refused
// naming it and leaves neither the file nor its temporary behind.
TEST(FileTest, AnAtomicWriterAppendsBytesAndOtherFilesExtentsInOrder) {
  const std::string dir = testing::freshDir("atomic_writer");
  std::vector<uint8_t> source(3 << 20);
  std::iota(source.begin(), source.end(), uint8_t{7});
  writeFileAtomically(dir + "/source.bin", source, "test file");
  const int fd = ::open((dir + "/source.bin").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const std::vector<uint8_t> head = {1, 2, 3}, tail = {4};
  for (const bool kernel : {true, false}) {
    const std::string path = dir + (kernel ? "/kernel.bin" : "/read.bin");
    {
      AtomicFileWriter out(path, "test file");
      out.write(head);
      out.copy({fd, 5, (2 << 20) + 3}, "'source.bin'", kernel);  // more than one read's piece
      out.write(tail);
      out.copy({fd, 1, 2}, "'source.bin'", kernel);
      out.copy({fd, 9, 0}, "'source.bin'", kernel);
      EXPECT_FALSE(std::filesystem::exists(path)) << "before commit";
      out.commit();
    }
    std::string want(head.begin(), head.end());
    want.append(source.begin() + 5, source.begin() + 5 + (2 << 20) + 3);
    want.append(tail.begin(), tail.end());
    want.append(source.begin() + 1, source.begin() + 3);
    EXPECT_EQ(readFile(path, "test file"), want) << (kernel ? "copy_file_range" : "pread");
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

    const std::string cut = dir + "/cut.bin";
    expectThrowWith<IoError>(
        [&] {
          AtomicFileWriter out(cut, "test file");
          out.copy({fd, source.size() - 10, 20}, "'source.bin'", kernel);
          out.commit();
        },
        {"'source.bin' ends 10 bytes before the 20 bytes at offset"});
    EXPECT_FALSE(std::filesystem::exists(cut));
    EXPECT_FALSE(std::filesystem::exists(cut + ".tmp"));
  }
  ::close(fd);
}

}  // namespace
}  // namespace tandem

// Where a node's data-plane links may connect: a worker's ipc links reach only sockets in
// another worker's private folder, never the node's other Unix sockets.
#include "runtime/node/link_rules.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

using testing::expectThrowWith;

TEST(LinkRulesTest, AWorkersSocketFolderIsItsUsersAloneAndGoesWithIt) {
  std::string path;
  {
    PrivateSocketDir dir;
    path = dir.path();
    struct stat st {};
    ASSERT_EQ(::lstat(path.c_str(), &st), 0) << path;
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_EQ(st.st_uid, ::geteuid());
    EXPECT_EQ(std::filesystem::path(path).filename().string().rfind("tandem-", 0), 0u) << path;
    std::ofstream(path + "/l0") << "x";  // a socket file left by a link
    EXPECT_NO_THROW(checkPeerEndpoint("ipc://" + path + "/l0", "ipc"));
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << path;
}

TEST(LinkRulesTest, AnIpcLinkReachesOnlyAWorkersFolder) {
  PrivateSocketDir dir;
  const std::string scratch = testing::freshDir("link-rules");
  const std::string open_dir = scratch + "/tandem-open";
  std::filesystem::create_directory(open_dir);
  ::chmod(open_dir.c_str(), 0755);
  const std::string link = scratch + "/tandem-link";
  std::filesystem::create_directory_symlink(dir.path(), link);
  for (const std::string& peer :
       {std::string("ipc://@tandem-1-0-0-l0"), std::string("ipc:///var/run/docker.sock"),
        "ipc://" + dir.path() + "/", "ipc://" + dir.path() + "/../x", "ipc://" + open_dir + "/l0",
        "ipc://" + link + "/l0", std::string("tcp://127.0.0.1:9"), "ipc://" + scratch + "/l0"})
    expectThrowWith<InvalidArgument>([&] { checkPeerEndpoint(peer, "ipc"); },
                                     {"connects only to sockets in a worker's own folder", peer});
  EXPECT_NO_THROW(checkPeerEndpoint("ipc://" + dir.path() + "/l3", "ipc"));
  expectThrowWith<InvalidArgument>([&] { checkPeerEndpoint("ipc://" + dir.path() + "/l3"); },
                                   {"connects to 'tcp://...' endpoints only"});
}

}  // namespace
}  // namespace tandem::runtime

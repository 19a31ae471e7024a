// Worker processes start with only the descriptors they are handed: none of the daemon's
// listening sockets, connections or files, close-on-exec or not.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "runtime/control/cluster_key.h"
#include "runtime/job/coordinator.h"
#include "tests/test_util.h"

namespace tandem::runtime {
namespace {

TEST(LaunchersTest, AWorkerHoldsNoneOfItsParentsDescriptors) {
  const std::string dir = testing::freshDir("launchers-fds");
  // What a daemon holds: a file and a listening socket, neither marked close-on-exec.
  std::ofstream(dir + "/daemon-secret") << "x";
  const int file = ::open((dir + "/daemon-secret").c_str(), O_RDONLY);
  ASSERT_GE(file, 0);
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  // The "worker" reads its key, as a worker does (one that has exited before the key is
  // written fails the launch), then lists its descriptors (ls execs in the shell's place:
  // /proc/self is it).
  const std::string listing = dir + "/fds";
  auto launcher = processLauncher(
      "/bin/sh", {"-c", "read key; exec ls -l /proc/self/fd >" + listing + " 2>&1", "worker"});
  launcher->start(0, parseEndpoint("127.0.0.1:1"), generateClusterKey());
  EXPECT_EQ(launcher->finish(std::chrono::seconds(10)), "");
  ::close(file);
  ::close(listener);
  std::stringstream text;
  text << std::ifstream(listing).rdbuf();
  const std::string fds = text.str();
  // 0: the key's pipe, 1 and 2: the listing, 3: the directory ls reads.
  EXPECT_NE(fds.find(" 0 -> pipe:"), std::string::npos) << fds;
  EXPECT_EQ(fds.find("daemon-secret"), std::string::npos) << fds;
  EXPECT_EQ(fds.find("socket:"), std::string::npos) << fds;
  int links = 0;  // descriptors, one " -> " each
  for (size_t at = fds.find(" -> "); at != std::string::npos; at = fds.find(" -> ", at + 1))
    ++links;
  EXPECT_EQ(links, 4) << fds;
}

}  // namespace
}  // namespace tandem::runtime

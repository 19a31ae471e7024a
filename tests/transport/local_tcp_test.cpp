// transport/local_tcp: which connections are local, and their congestion control.
#include "transport/local_tcp.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "tests/transport/tcp_probe.h"

namespace tandem::transport {
namespace {

using testing::loopbackPair;
using testing::systemCongestion;

// chooseLocalCongestion: the wanted algorithm on a loopback connection, reno where the
// kernel refuses it, the system's with none wanted; nothing for a socket that is not TCP.
TEST(LocalTcpTest, LocalConnectionsGetTheChosenCongestionControl) {
  const std::string system = systemCongestion();
  ASSERT_FALSE(system.empty()) << "no /proc/sys/net/ipv4/tcp_congestion_control";
  auto [client, accepted] = loopbackPair();
  EXPECT_EQ(chooseLocalCongestion(client, ""), system);
  EXPECT_EQ(chooseLocalCongestion(client, "reno"), "reno");
  EXPECT_EQ(chooseLocalCongestion(accepted, "no_such_algorithm"), "reno");
  ::close(client);
  ::close(accepted);
  const auto [client6, accepted6] = loopbackPair(AF_INET6);
  if (client6 >= 0) {
    EXPECT_EQ(chooseLocalCongestion(client6, "reno"), "reno");
    EXPECT_EQ(chooseLocalCongestion(accepted6, "reno"), "reno");
    ::close(client6);
    ::close(accepted6);
  }
  int unix_pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, unix_pair), 0);
  EXPECT_EQ(chooseLocalCongestion(unix_pair[0], "reno"), "");
  ::close(unix_pair[0]);
  ::close(unix_pair[1]);
}

}  // namespace
}  // namespace tandem::transport

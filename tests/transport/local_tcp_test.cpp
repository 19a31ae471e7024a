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
  const auto v4 = loopbackPair();
  ASSERT_TRUE(v4.has_value());
  EXPECT_EQ(chooseLocalCongestion(v4->first.get(), ""), system);
  EXPECT_EQ(chooseLocalCongestion(v4->first.get(), "reno"), "reno");
  EXPECT_EQ(chooseLocalCongestion(v4->second.get(), "no_such_algorithm"), "reno");
  if (const auto v6 = loopbackPair(AF_INET6)) {
    EXPECT_EQ(chooseLocalCongestion(v6->first.get(), "reno"), "reno");
    EXPECT_EQ(chooseLocalCongestion(v6->second.get(), "reno"), "reno");
  }
  int unix_pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, unix_pair), 0);
  EXPECT_EQ(chooseLocalCongestion(unix_pair[0], "reno"), "");
  ::close(unix_pair[0]);
  ::close(unix_pair[1]);
}

}  // namespace
}  // namespace tandem::transport

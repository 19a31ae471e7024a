// What the transport tests make and read back of this process's TCP connections: a
// loopback pair, the congestion control each connection uses, and the system's default.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "transport/tcp/socket.h"

namespace tandem::testing {

// A connected loopback TCP pair over IPv4 or IPv6 (tcp::loopbackPair, blocking):
// {client, accepted}, or nullopt where the family has no loopback (a machine without
// IPv6), which for IPv4 fails the test.
inline std::optional<std::pair<transport::tcp::Socket, transport::tcp::Socket>> loopbackPair(
    int family = AF_INET) {
  auto pair = transport::tcp::loopbackPair(family);
  if (!pair) {
    EXPECT_EQ(family, AF_INET6) << "no IPv4 loopback connection";
  }
  return pair;
}

// The congestion control of every connected TCP socket of this process, by descriptor.
inline std::map<int, std::string> congestionOfConnectedTcpSockets() {
  std::map<int, std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(entry.path().filename().string());
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    char name[32] = {};
    socklen_t name_length = sizeof(name) - 1;
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) == 0 &&
        ::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &name_length) == 0)
      found[fd] = name;
  }
  return found;
}

// The port of a socket's own address (`peer`: of its peer's), 0 if it has none.
inline int portOf(int fd, bool peer) {
  return (peer ? transport::tcp::peerAddress(fd) : transport::tcp::localAddress(fd)).port();
}

// net.ipv4.tcp_congestion_control ("" where it cannot be read).
inline std::string systemCongestion() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string name;
  in >> name;
  return name;
}

}  // namespace tandem::testing

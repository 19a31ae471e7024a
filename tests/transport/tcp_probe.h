// What the transport tests make and read back of this process's TCP connections: a
// loopback pair, the congestion control each connection uses, and the system's default.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>

namespace tandem::testing {

// A connected loopback TCP pair over IPv4 or IPv6: {client, accepted}, or {-1, -1}
// where the family has no loopback (a machine without IPv6).
inline std::pair<int, int> loopbackPair(int family = AF_INET) {
  sockaddr_storage here{};
  socklen_t length = sizeof(here);
  if (family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&here);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_loopback;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&here);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  const int listener = ::socket(family, SOCK_STREAM, 0);
  const int client = ::socket(family, SOCK_STREAM, 0);
  auto* address = reinterpret_cast<sockaddr*>(&here);
  if (listener < 0 || client < 0 || ::bind(listener, address, length) != 0 ||
      ::listen(listener, 1) != 0 || ::getsockname(listener, address, &length) != 0 ||
      ::connect(client, address, length) != 0) {
    for (int fd : {listener, client})
      if (fd >= 0) ::close(fd);
    EXPECT_EQ(family, AF_INET6) << "no IPv4 loopback connection";
    return {-1, -1};
  }
  const int accepted = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  return {client, accepted};
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
  sockaddr_storage a{};
  socklen_t length = sizeof(a);
  auto* address = reinterpret_cast<sockaddr*>(&a);
  if ((peer ? ::getpeername(fd, address, &length) : ::getsockname(fd, address, &length)) != 0)
    return 0;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  return 0;
}

// net.ipv4.tcp_congestion_control ("" where it cannot be read).
inline std::string systemCongestion() {
  std::ifstream in("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string name;
  in >> name;
  return name;
}

}  // namespace tandem::testing

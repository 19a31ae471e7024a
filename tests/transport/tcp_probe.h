// What the transport tests read back from this process's TCP connections: the
// congestion control each uses, and the system's default.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace tandem::testing {

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

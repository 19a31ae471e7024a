#include "transport/local_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cstring>
#include <filesystem>
#include <set>

namespace tandem::transport {

bool peerIsLocal(int fd) {
  sockaddr_storage here{}, there{};
  socklen_t here_length = sizeof(here), there_length = sizeof(there);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&here), &here_length) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&there), &there_length) != 0 ||
      here.ss_family != there.ss_family)
    return false;
  if (there.ss_family == AF_INET) {
    const in_addr a = reinterpret_cast<const sockaddr_in*>(&there)->sin_addr;
    const in_addr b = reinterpret_cast<const sockaddr_in*>(&here)->sin_addr;
    return (ntohl(a.s_addr) >> 24) == 127 || a.s_addr == b.s_addr;
  }
  if (there.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&there)->sin6_addr;
    const in6_addr& b = reinterpret_cast<const sockaddr_in6*>(&here)->sin6_addr;
    const bool v4_loopback = IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127;
    return IN6_IS_ADDR_LOOPBACK(&a) || v4_loopback || std::memcmp(&a, &b, sizeof(a)) == 0;
  }
  return false;
}

std::string chooseLocalCongestion(int fd, const std::string& wanted) {
  if (!wanted.empty() && peerIsLocal(fd)) {
    // EPERM where the process may not choose `wanted` (not in the kernel's
    // tcp_allowed_congestion_control), ENOENT where the kernel lacks it.
    for (const std::string& name : {wanted, std::string("reno")})
      if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(),
                       static_cast<socklen_t>(name.size())) == 0)
        break;
  }
  char name[32] = {};
  socklen_t length = sizeof(name) - 1;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &length) != 0) return "";
  return std::string(name, ::strnlen(name, length));
}

std::string chooseLocalCongestionForAll(const std::string& wanted) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string fd = entry.path().filename().string();
    if (fd.empty() || fd.find_first_not_of("0123456789") != std::string::npos) continue;
    const int d = std::stoi(fd);
    if (!peerIsLocal(d)) continue;
    const std::string name = chooseLocalCongestion(d, wanted);
    if (!name.empty()) names.insert(name);
  }
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace tandem::transport

// A flood of idle connections without the key, for the tests of the daemon's and the
// coordinator's listeners (admission.h).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/endpoint.h"

namespace tandem::testing {

using namespace std::chrono_literals;

// A peer without the key holding `count` idle connections to `at` (IPv4 loopback),
// reopening each as it is dropped, until destroyed (at most 30 s). With `first_byte`,
// each connection sends one byte and then stalls: it looks like the start of a hello.
class IdleFlood {
 public:
  IdleFlood(const Endpoint& at, int count, bool first_byte = false) {
    thread_ = std::thread([this, at, count, first_byte] {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(at.port);
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      auto open = [&] {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
          ::close(fd);
          return -1;
        }
        if (fd >= 0 && first_byte) {
          const char byte = 1;
          if (::send(fd, &byte, 1, MSG_NOSIGNAL) != 1) {
            ::close(fd);
            return -1;
          }
        }
        return fd;
      };
      std::vector<pollfd> fds(static_cast<size_t>(count));
      for (pollfd& p : fds) p = {open(), POLLIN, 0};
      const auto until = std::chrono::steady_clock::now() + 30s;
      while (!stop_ && std::chrono::steady_clock::now() < until) {
        if (::poll(fds.data(), fds.size(), 50) < 0) break;
        for (pollfd& p : fds)
          if (p.fd < 0 || (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
            if (p.fd >= 0) ::close(p.fd);  // dropped by the daemon
            p.fd = open();
            p.revents = 0;
            ++reopened_;
          }
      }
      for (pollfd& p : fds)
        if (p.fd >= 0) ::close(p.fd);
    });
    std::this_thread::sleep_for(500ms);  // up
  }
  ~IdleFlood() {
    stop_ = true;
    thread_.join();
  }
  uint64_t reopened() const { return reopened_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> reopened_{0};
  std::thread thread_;
};

}  // namespace tandem::testing

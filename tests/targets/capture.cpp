#include "tests/targets/capture.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

namespace tandem::testing {

namespace {

volatile sig_atomic_t g_stop = 0;

void onStop(int) { g_stop = 1; }

// The child: joins the namespace, opens a packet socket on all its interfaces, says so on
// `ready`, then writes each arriving frame as [uint32 length][bytes] until told to stop.
[[noreturn]] void captureChild(const std::string& netns, const std::string& path, int ready,
                               int limit_s, long limit_bytes) {
  auto fail = [&](const char* what) {
    std::fprintf(stderr, "capture in %s: %s: %s\n", netns.c_str(), what, std::strerror(errno));
    _exit(1);
  };
  signal(SIGTERM, onStop);
  const int ns = open(("/var/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
  if (ns < 0) fail("open the namespace");
  if (setns(ns, CLONE_NEWNET) != 0) fail("setns");
  const int s = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, htons(ETH_P_ALL));
  if (s < 0) fail("packet socket");
  const int out = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out < 0) fail("open the capture file");
  const char one = 1;
  if (write(ready, &one, 1) != 1) fail("say it is ready");
  close(ready);
  std::vector<uint8_t> frame(65536 + 4);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(limit_s);
  long written = 0;
  while (!g_stop && std::chrono::steady_clock::now() < until && written < limit_bytes) {
    pollfd p{s, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    sockaddr_ll from{};
    socklen_t len = sizeof from;
    const ssize_t n =
        recvfrom(s, frame.data() + 4, 65536, 0, reinterpret_cast<sockaddr*>(&from), &len);
    // Each frame once: where it arrives, not again where the bridge sends it on.
    if (n <= 0 || from.sll_pkttype == PACKET_OUTGOING) continue;
    const auto size = static_cast<uint32_t>(n);
    std::memcpy(frame.data(), &size, 4);
    if (write(out, frame.data(), static_cast<size_t>(n) + 4) != n + 4) fail("write");
    written += n + 4;
  }
  close(out);
  _exit(0);
}

}  // namespace

PacketCapture::PacketCapture(const std::string& netns, const std::string& path, int limit_s,
                             long limit_bytes)
    : path_(path) {
  int ready[2];
  if (pipe(ready) != 0) return;
  pid_ = fork();
  if (pid_ == 0) {
    close(ready[0]);
    captureChild(netns, path, ready[1], limit_s, limit_bytes);
  }
  close(ready[1]);
  if (pid_ > 0) {
    pollfd p{ready[0], POLLIN, 0};
    char byte = 0;
    ok_ = poll(&p, 1, 10000) == 1 && read(ready[0], &byte, 1) == 1;
  }
  close(ready[0]);
}

PacketCapture::~PacketCapture() { stop(); }

bool PacketCapture::stop() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    ok_ = ok_ && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    pid_ = -1;
  }
  return ok_;
}

std::map<std::string, std::string> tcpStreams(const std::string& capture_path) {
  std::ifstream in(capture_path, std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, std::string> out;
  auto u16 = [](const uint8_t* p) { return static_cast<unsigned>(p[0] << 8 | p[1]); };
  auto address = [](const uint8_t* ip, unsigned port) {
    char text[32];
    std::snprintf(text, sizeof text, "%u.%u.%u.%u:%u", ip[0], ip[1], ip[2], ip[3], port);
    return std::string(text);
  };
  for (size_t at = 0; at + 4 <= all.size();) {
    uint32_t size = 0;
    std::memcpy(&size, all.data() + at, 4);
    if (at + 4 + size > all.size()) break;  // cut off by the limit
    const auto* f = reinterpret_cast<const uint8_t*>(all.data() + at + 4);
    at += 4 + size;
    // Ethernet, then IPv4 carrying TCP.
    if (size < 14 + 20 || u16(f + 12) != 0x0800) continue;
    const uint8_t* ip = f + 14;
    const unsigned ihl = (ip[0] & 0x0f) * 4u, total = u16(ip + 2);
    if ((ip[0] >> 4) != 4 || ip[9] != 6 || ihl < 20 || total > size - 14) continue;
    const uint8_t* tcp = ip + ihl;
    if (total < ihl + 20) continue;
    const unsigned offset = (tcp[12] >> 4) * 4u;
    if (offset < 20 || ihl + offset > total) continue;
    out[address(ip + 12, u16(tcp)) + " > " + address(ip + 16, u16(tcp + 2))].append(
        reinterpret_cast<const char*>(tcp + offset), total - ihl - offset);
  }
  return out;
}

double entropyBits(const std::string& bytes) {
  std::array<double, 256> counts{};
  for (const char c : bytes) counts[static_cast<uint8_t>(c)] += 1;
  double bits = 0;
  const auto n = static_cast<double>(bytes.size());
  for (const double k : counts)
    if (k > 0) bits -= k / n * std::log2(k / n);
  return bits;
}

}  // namespace tandem::testing

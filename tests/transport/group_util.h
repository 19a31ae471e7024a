// The ranks of a collective group of any kind, made for tests (group_test.cpp,
// socket_group_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/spin.h"
#include "tests/test_util.h"
#include "transport/curve.h"
#include "transport/local_group.h"
#include "transport/local_tcp.h"
#include "transport/socket_group.h"
#include "transport/zmq_group.h"

namespace tandem::transport::test {

using tandem::testing::onThreads;

// The ranks of one group, of either kind, with what they need to live.
struct Ranks {
  std::unique_ptr<Context> ctx;
  std::vector<std::unique_ptr<cpu::CpuBackend>> hosts;
  std::vector<std::unique_ptr<Group>> groups;
  std::shared_ptr<void> rendezvous;  // removes the rendezvous directory at the end
  size_t size() const { return groups.size(); }
  Group& operator[](size_t r) { return *groups[r]; }
};

// "local": the in-process group; "tcp", "tcp-fp16", "tcp-bf16", "ipc": over ZeroMQ links;
// "socket", "socket-fp16", "socket-bf16", "socket-ipc": over plain sockets.
// `curve`: each rank's CurveZMQ key pair (ZeroMQ kinds), empty for plain links.
inline Ranks makeRanks(const std::string& kind, int world,
                       std::chrono::milliseconds link_timeout = std::chrono::seconds(30),
                       const std::vector<CurveKeyPair>& curve = {}) {
  Ranks g;
  if (kind == "local") {
    g.groups = makeLocalGroup(world);
    return g;
  }
  static std::atomic<int> made{0};
  ++made;
  const std::string dir = testing::freshDir("tandem-group");
  g.rendezvous = std::shared_ptr<void>(nullptr, [dir](void*) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  });
  const bool socket = kind.starts_with("socket");
  const Codec codec = kind.ends_with("fp16")   ? Codec::kF16
                      : kind.ends_with("bf16") ? Codec::kBF16
                                               : Codec::kRaw;
  const std::string transport = kind.ends_with("ipc") ? "ipc" : "tcp";
  if (!socket) g.ctx = std::make_unique<Context>();
  g.groups.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) g.hosts.push_back(std::make_unique<cpu::CpuBackend>());
  const auto errors = onThreads(world, [&](int r) {
    const Exchange exchange = fileExchange(dir, r, world, std::chrono::seconds(20));
    auto common = [&](auto& o) {  // what the two kinds of options share
      o.rank = r;
      o.size = world;
      o.transport = transport;
      o.ipc_dir = ::testing::TempDir();
      o.group_id = static_cast<uint64_t>(made.load());
      o.codec = codec;
    };
    if (socket) {
      SocketGroupOptions o;
      common(o);
      g.groups[static_cast<size_t>(r)] = makeSocketGroup(o, exchange);
      return;
    }
    ZmqGroupOptions o;
    common(o);
    o.link_timeout = link_timeout;
    if (!curve.empty()) {
      o.curve_secret_key = curve[static_cast<size_t>(r)].secret_key;
      o.curve_public_key = curve[static_cast<size_t>(r)].public_key;
    }
    g.groups[static_cast<size_t>(r)] =
        makeZmqGroup(*g.ctx, *g.hosts[static_cast<size_t>(r)], o, exchange);
  });
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return g;
}

}  // namespace tandem::transport::test

// The process's ZeroMQ context, the malloc tuning a program may choose, and the ZAP handler that
// admits only the peer keys links have registered (so an encrypted link is also an authenticated
// one).
#include "transport/context.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace tandem::transport {

void keepFreedMemory(size_t bytes) {
#ifdef __GLIBC__
  // glibc's ceiling for the mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX).
  const int map_threshold = sizeof(long) == 8 ? 32 << 20 : 512 << 10;
  const auto keep = static_cast<int>(std::min<size_t>(bytes, 1u << 30));
  mallopt(M_MMAP_THRESHOLD, map_threshold);
  mallopt(M_TRIM_THRESHOLD, keep);
#else
  (void)bytes;
#endif
}

Context::Context(const ContextOptions& options) : ctx_(options.io_threads) {}

Context::~Context() {
  stop_ = true;
  if (zap_.joinable()) zap_.join();
}

void Context::allowCurveKey(const std::string& public_key_z85) {
  uint8_t binary[32];
  if (public_key_z85.size() != 40 || zmq_z85_decode(binary, public_key_z85.c_str()) == nullptr)
    throw InvalidArgument("not a Z85 CurveZMQ public key");
  std::lock_guard<std::mutex> lock(mutex_);
  allowed_.insert(std::string(reinterpret_cast<char*>(binary), 32));
  if (!zap_.joinable()) {
    // The handler's socket must be bound before any CURVE socket asks it: bind here.
    auto socket = std::make_shared<zmq::socket_t>(ctx_, zmq::socket_type::rep);
    socket->set(zmq::sockopt::linger, 0);
    socket->bind("inproc://zeromq.zap.01");
    zap_ = std::thread([this, socket] {
      zmq::pollitem_t item{socket->handle(), 0, ZMQ_POLLIN, 0};
      while (!stop_) {
        if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
        // ZAP request (RFC 27): version, id, domain, address, identity, mechanism, key...
        std::vector<zmq::message_t> frames;
        do {
          frames.emplace_back();
          if (!socket->recv(frames.back(), zmq::recv_flags::none)) break;
        } while (frames.back().more());
        const std::string id = frames.size() > 1 ? frames[1].to_string() : "";
        bool ok = frames.size() >= 7 && frames[5].to_string() == "CURVE" && frames[6].size() == 32;
        if (ok) {
          std::lock_guard<std::mutex> lock(mutex_);
          ok = allowed_.count(frames[6].to_string()) > 0;
        }
        const std::string replies[] = {"1.0", id, ok ? "200" : "400", ok ? "OK" : "key not allowed",
                                       "",    ""};
        for (size_t i = 0; i < 6; ++i)
          socket->send(zmq::buffer(replies[i]),
                       i < 5 ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
    });
  }
}

}  // namespace tandem::transport

#include "runtime/control/channel.h"

#include <sodium.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/control/channel_io.h"

namespace tandem::runtime {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kTagBytes = crypto_aead_chacha20poly1305_ietf_ABYTES;
constexpr size_t kKeptBodyBytes = size_t{1} << 20;  // a frame buffer kept between frames

// The 12-byte nonce of message number `n` in one direction (each direction has its own
// key, so the counter alone keeps every nonce unique under its key).
std::array<uint8_t, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> counterNonce(uint64_t n) {
  std::array<uint8_t, crypto_aead_chacha20poly1305_ietf_NPUBBYTES> nonce{};
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<uint8_t>(n >> (8 * i));
  return nonce;
}

}  // namespace

struct Channel::Impl {
  Impl(std::unique_ptr<asio::io_context> io_context, tcp::socket s, const SessionKeys& k,
       const Hello& hello, std::string peer_name, const ChannelOptions& o)
      : io(std::move(io_context)),
        socket(std::move(s)),
        timer(*io),
        guard(asio::make_work_guard(*io)),
        keys(k),
        peer_hello(hello),
        peer(std::move(peer_name)),
        options(o) {
    boost::system::error_code ec;
    const tcp::endpoint here = socket.local_endpoint(ec);
    if (!ec) local_host = here.address().to_string();
    last_heard = last_sent = Clock::now();
    io->restart();  // the handshake ran it to completion, which leaves it stopped
    readHeader();
    armTimer();
    thread = std::thread([this] { io->run(); });
  }

  ~Impl() {
    fail("the channel was closed on this side");
    guard.reset();
    io->stop();
    if (thread.joinable()) thread.join();
    sodium_memzero(keys.send.data(), keys.send.size());
    sodium_memzero(keys.receive.data(), keys.receive.size());
  }

  // --- I/O thread ---------------------------------------------------------------------

  void readHeader() {
    asio::async_read(socket, asio::buffer(header), [this](boost::system::error_code ec, size_t) {
      if (ec) return readFailed(ec);
      const uint32_t len =
          static_cast<uint32_t>(header[0]) | static_cast<uint32_t>(header[1]) << 8 |
          static_cast<uint32_t>(header[2]) << 16 | static_cast<uint32_t>(header[3]) << 24;
      if (len < kTagBytes || len > options.max_message_bytes + kTagBytes)
        return fail(peer + " sent a frame of " + std::to_string(len) + " bytes (the limit is " +
                    std::to_string(options.max_message_bytes) + " bytes and a " +
                    std::to_string(kTagBytes) + "-byte tag)");
      body.resize(len);
      readBody();
    });
  }

  void readBody() {
    asio::async_read(socket, asio::buffer(body), [this](boost::system::error_code ec, size_t) {
      if (ec) return readFailed(ec);
      std::vector<uint8_t> plain(body.size() - kTagBytes);
      unsigned long long plain_len = 0;
      const auto nonce = counterNonce(received_count++);
      if (crypto_aead_chacha20poly1305_ietf_decrypt(plain.data(), &plain_len, nullptr, body.data(),
                                                    body.size(), nullptr, 0, nonce.data(),
                                                    keys.receive.data()) != 0)
        return fail("a frame from " + peer +
                    " failed authentication (altered, replayed or not sealed with this "
                    "session's key)");
      // A large frame's buffer is not kept for an idle connection.
      if (body.capacity() > kKeptBodyBytes) std::vector<uint8_t>().swap(body);
      std::unique_lock lock(mu);
      last_heard = Clock::now();
      if (plain.empty()) {  // a heartbeat
        lock.unlock();
        return readHeader();
      }
      queued_bytes += plain.size();
      queue.push_back(std::move(plain));
      cv.notify_all();
      if (queue.size() >= options.max_queued || queued_bytes >= options.max_queued_bytes) {
        paused = true;  // recv() starts reading again when it takes one
        return;
      }
      lock.unlock();
      readHeader();
    });
  }

  void readFailed(const boost::system::error_code& ec) {
    if (ec == asio::error::operation_aborted) return;
    if (ec == asio::error::eof || ec == asio::error::connection_reset)
      fail(closingNow() ? "the channel was closed on this side" : peer + " closed the connection");
    else
      fail("reading from " + peer + " failed: " + ec.message());
  }

  bool closingNow() {
    std::lock_guard lock(mu);
    return closing;
  }

  void armTimer() {
    const auto tick = std::max(options.heartbeat / 2, std::chrono::milliseconds(1));
    timer.expires_after(tick);
    timer.async_wait([this, tick](boost::system::error_code ec) {
      if (ec) return;
      const auto now = Clock::now();
      std::unique_lock lock(mu);
      if (ended) return;
      if (paused) last_heard = now;  // its unread heartbeats wait in our socket
      const auto silent = now - last_heard;
      if (silent > options.heartbeat * options.strikes) {
        lock.unlock();
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(silent).count();
        return fail("no word from " + peer + " for " + std::to_string(ms) + " ms (" +
                    std::to_string(options.strikes) + " heartbeats of " +
                    std::to_string(options.heartbeat.count()) + " ms missed)");
      }
      // Closing: this side has sent its FIN and sends nothing more.
      const bool idle = !closing && now - last_sent >= tick && writes.empty();
      lock.unlock();
      if (idle) queueHeartbeat();
      armTimer();
    });
  }

  void queueHeartbeat() {
    std::unique_lock lock(mu);
    if (ended) return;
    std::vector<uint8_t> frame = seal({});
    unsent += frame.size();
    writes.push_back(std::move(frame));
    if (writes.size() == 1) {
      lock.unlock();
      writeFront();
    }
  }

  void writeFront() {
    // Called with `writes` non-empty and no write in flight. The front frame stays in
    // place (deque elements do not move on push_back) until its write completes.
    std::vector<uint8_t>* front;
    {
      std::lock_guard lock(mu);
      front = &writes.front();
    }
    asio::async_write(socket, asio::buffer(*front), [this](boost::system::error_code ec, size_t) {
      if (ec) {
        if (ec != asio::error::operation_aborted)
          fail("writing to " + peer + " failed: " + ec.message());
        return;
      }
      std::unique_lock lock(mu);
      unsent -= writes.front().size();
      writes.pop_front();
      last_sent = Clock::now();
      cv.notify_all();
      const bool more = !writes.empty();
      lock.unlock();
      if (more) writeFront();
    });
  }

  // --- any thread ---------------------------------------------------------------------

  // Ends the channel once, with `why`; closes the socket on the I/O thread.
  void fail(const std::string& why) {
    {
      std::lock_guard lock(mu);
      if (ended) return;
      ended = true;
      failure = why;
      cv.notify_all();
    }
    asio::post(*io, [this] {
      boost::system::error_code ignored;
      timer.cancel();
      socket.shutdown(tcp::socket::shutdown_both, ignored);
      socket.close(ignored);
    });
  }

  // One frame: the length, then `message` sealed under the next send nonce. Called with
  // `mu` held, and the frame queued before it is released, so frames go out in nonce
  // order.
  std::vector<uint8_t> seal(std::span<const uint8_t> message) {
    const size_t len = message.size() + kTagBytes;
    std::vector<uint8_t> frame(4 + len);
    for (int i = 0; i < 4; ++i)
      frame[static_cast<size_t>(i)] = static_cast<uint8_t>(len >> (8 * i));
    unsigned long long out_len = 0;
    const auto nonce = counterNonce(sent_count++);
    crypto_aead_chacha20poly1305_ietf_encrypt(frame.data() + 4, &out_len, message.data(),
                                              message.size(), nullptr, 0, nullptr, nonce.data(),
                                              keys.send.data());
    return frame;
  }

  void send(std::span<const uint8_t> message, std::chrono::milliseconds timeout) {
    if (message.size() > options.max_message_bytes)
      throw InvalidArgument("a control message of " + std::to_string(message.size()) +
                            " bytes exceeds the limit of " +
                            std::to_string(options.max_message_bytes));
    std::unique_lock lock(mu);
    if (!cv.wait_for(lock, timeout, [&] { return ended || unsent <= options.max_unsent_bytes; }))
      throw Timeout(peer + " did not take " + std::to_string(unsent) + " queued bytes within " +
                    std::to_string(timeout.count()) + " ms");
    if (ended || closing)
      throw IoError("the channel to " + peer + " has ended: " +
                    (ended ? failure : std::string("it is being closed on this side")));
    std::vector<uint8_t> frame = seal(message);
    unsent += frame.size();
    writes.push_back(std::move(frame));
    if (writes.size() == 1) asio::post(*io, [this] { writeFront(); });
  }

  std::optional<std::vector<uint8_t>> take(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, timeout, [&] { return ended || !queue.empty(); });
    if (queue.empty()) {
      if (ended) throw IoError("the channel to " + peer + " has ended: " + failure);
      return std::nullopt;
    }
    std::vector<uint8_t> m = std::move(queue.front());
    queue.pop_front();
    queued_bytes -= m.size();
    if (paused && !ended && queue.size() < options.max_queued &&
        queued_bytes < options.max_queued_bytes) {
      paused = false;
      asio::post(*io, [this] { readHeader(); });
    }
    return m;
  }

  std::unique_ptr<asio::io_context> io;
  tcp::socket socket;
  asio::steady_timer timer;
  asio::executor_work_guard<asio::io_context::executor_type> guard;
  SessionKeys keys;
  const Hello peer_hello;
  const std::string peer;
  std::string local_host;
  const ChannelOptions options;
  std::thread thread;

  std::array<uint8_t, 4> header{};  // I/O thread only
  std::vector<uint8_t> body;        // I/O thread only
  uint64_t received_count = 0;      // I/O thread only

  mutable std::mutex mu;    // everything below
  uint64_t sent_count = 0;  // the next send nonce
  std::condition_variable cv;
  std::deque<std::vector<uint8_t>> queue;   // received, not yet taken
  size_t queued_bytes = 0;                  // in `queue`
  std::deque<std::vector<uint8_t>> writes;  // sealed frames, the front one being written
  size_t unsent = 0;                        // bytes in `writes`
  bool paused = false;                      // reading stopped: `queue` is full
  bool closing = false;                     // close() sent this side's FIN
  bool ended = false;
  std::string failure;
  Clock::time_point last_heard, last_sent;
};

Channel::Channel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Channel::~Channel() = default;

void Channel::send(const Message& m, std::chrono::milliseconds timeout) {
  const std::vector<uint8_t> bytes = encodeMessage(m);
  impl_->send(bytes, timeout);
}

void Channel::sendBytes(std::span<const uint8_t> message, std::chrono::milliseconds timeout) {
  if (message.empty()) throw InvalidArgument("an empty control message (that is a heartbeat)");
  impl_->send(message, timeout);
}

std::optional<Message> Channel::recv(std::chrono::milliseconds timeout) {
  const std::optional<std::vector<uint8_t>> bytes = impl_->take(timeout);
  if (!bytes) return std::nullopt;
  try {
    return decodeMessage(*bytes);
  } catch (const FormatError& e) {
    throw FormatError(std::string(e.what()) + " (from " + impl_->peer + ")");
  }
}

// A graceful close: the queued frames go out, then this side's FIN (shutdown of sending
// only); the peer reads everything up to it, and closes in turn, which ends the channel
// here. Closing both ways at once instead would answer any frame still unread on this
// side (a heartbeat) with a reset, and a reset can discard what the peer has not read yet
// — a worker's last report was lost that way under load.
void Channel::close(std::chrono::milliseconds flush) {
  Impl& c = *impl_;
  const auto until = std::chrono::steady_clock::now() + flush;
  {
    std::unique_lock lock(c.mu);
    c.cv.wait_until(lock, until, [&] { return c.ended || c.writes.empty(); });
    if (c.ended) return;
    c.closing = true;
  }
  boost::asio::post(*c.io, [&c] {
    boost::system::error_code ignored;
    c.socket.shutdown(tcp::socket::shutdown_send, ignored);
  });
  {
    std::unique_lock lock(c.mu);  // the peer's FIN (or anything else) ends the channel
    c.cv.wait_until(lock, until, [&] { return c.ended; });
  }
  c.fail("the channel was closed on this side");
}

const std::string& Channel::peer() const { return impl_->peer; }
const std::string& Channel::localHost() const { return impl_->local_host; }
const Hello& Channel::peerHello() const { return impl_->peer_hello; }

std::string Channel::failure() const {
  std::lock_guard lock(impl_->mu);
  return impl_->failure;
}

size_t Channel::queuedBytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->queued_bytes;
}

std::unique_ptr<Channel> startChannel(std::unique_ptr<asio::io_context> io, tcp::socket socket,
                                      const SessionKeys& keys, const Hello& peer_hello,
                                      const std::string& peer, const ChannelOptions& options) {
  if (sodium_init() < 0) throw Error("libsodium failed to initialise");
  boost::system::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  return std::make_unique<Channel>(std::make_unique<Channel::Impl>(
      std::move(io), std::move(socket), keys, peer_hello, peer, options));
}

std::string peerName(const tcp::socket& socket) {
  boost::system::error_code ec;
  const tcp::endpoint e = socket.remote_endpoint(ec);
  if (ec) return "?";
  const std::string host = e.address().to_string();
  return (e.address().is_v6() ? "[" + host + "]" : host) + ":" + std::to_string(e.port());
}

}  // namespace tandem::runtime

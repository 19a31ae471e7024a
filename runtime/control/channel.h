// Channel: one authenticated control connection (made by connectChannel / acceptChannel,
// handshake.h). Every message travels as one frame — a 4-byte little-endian length, then
// the message sealed with ChaCha20-Poly1305 under this direction's session key and a
// counter nonce — so a frame that was altered, replayed, reordered or injected fails to
// open and ends the channel. Empty frames are heartbeats: each side looks every half
// `heartbeat` and sends one when it has sent nothing for that long, so a live peer is
// never silent much more than `heartbeat`; a peer silent for `strikes` heartbeats is
// declared gone (a closed connection is noticed at once). With the defaults a cut
// connection is noticed 0.5 to 0.875 s after it was cut, and a live peer has 0.5 s of
// slack for a stalled thread.
//
// Threads: the channel runs its own I/O thread. send() and recv() may be called from any
// thread (one receiver at a time); close() and the destructor from any thread but the
// I/O thread. Received messages wait in a bounded queue: when recv() falls behind, the
// channel stops reading (TCP then pushes back on the sender) and does not count the
// peer's heartbeats it has not read as missed.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "runtime/control/messages.h"

namespace tandem::runtime {

struct ChannelOptions {
  std::chrono::milliseconds heartbeat{250};
  int strikes = 3;                              // heartbeats missed before the peer is gone
  size_t max_message_bytes = size_t{16} << 20;  // larger frames end the channel
  size_t max_queued = 64;                       // received messages not yet taken by recv()
  // ... and their bytes: reading stops once the queue holds this much, so a connection
  // holds at most this plus one frame being read (and opened) of what its peer sent.
  size_t max_queued_bytes = size_t{32} << 20;
  size_t max_unsent_bytes = size_t{32} << 20;  // send() waits while more is queued
};

class Channel {
 public:
  struct Impl;
  explicit Channel(std::unique_ptr<Impl> impl);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Queues `m`. IoError if the channel has ended; Timeout if `timeout` passes while more
  // than max_unsent_bytes wait to go out.
  void send(const Message& m, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // The same with raw bytes as the message (tests send malformed messages with it).
  void sendBytes(std::span<const uint8_t> message,
                 std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // The next message, or nullopt when `timeout` passes first. Once the channel has
  // ended, the messages received before come first, then IoError saying why it ended
  // (closed by the peer, silent, a frame that failed to open), naming the peer.
  // FormatError for a message that opened but is not a valid control message: the
  // channel lives on.
  std::optional<Message> recv(std::chrono::milliseconds timeout);
  // Sends what is queued (waiting up to `flush`), then closes. recv() then raises IoError.
  void close(std::chrono::milliseconds flush = std::chrono::seconds(2));

  // "HOST:PORT" of the peer, for messages.
  const std::string& peer() const;
  // This side's address on the connection (no port): how the peer's machine reaches
  // this one.
  const std::string& localHost() const;
  // The peer's hello (its protocol version and build).
  const Hello& peerHello() const;
  // Why the channel ended; empty while it lives.
  std::string failure() const;
  // The bytes of the received messages recv() has not taken yet.
  size_t queuedBytes() const;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::runtime

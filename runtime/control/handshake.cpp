#include "runtime/control/handshake.h"

#include <algorithm>
#include <thread>

#include <sodium.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "core/error.h"
#include "runtime/control/channel_io.h"

namespace tandem::runtime {

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// Frames before authentication: the largest hello or refusal fits with room to spare.
constexpr size_t kMaxClearFrameBytes = 1024;

// One socket and its io_context, driven by the calling thread until the channel starts.
struct Step {
  asio::io_context& io;
  tcp::socket& socket;
  std::string peer;
  Clock::time_point deadline;

  // Runs `io` until `done`; at the deadline closes the socket and raises Timeout.
  void await(const bool& done, const std::string& what) {
    const auto now = Clock::now();
    io.restart();
    if (now < deadline) io.run_for(deadline - now);
    if (done) return;
    boost::system::error_code ignored;
    socket.close(ignored);
    io.restart();
    io.run();  // the aborted operation's handler
    throw Timeout(peer + ": no " + what + " within the handshake's deadline");
  }

  void write(const Message& m) {
    const std::vector<uint8_t> body = encodeMessage(m);
    std::vector<uint8_t> frame(4);
    for (int i = 0; i < 4; ++i)
      frame[static_cast<size_t>(i)] = static_cast<uint8_t>(body.size() >> (8 * i));
    frame.insert(frame.end(), body.begin(), body.end());
    bool done = false;
    boost::system::error_code ec;
    asio::async_write(socket, asio::buffer(frame), [&](boost::system::error_code e, size_t) {
      ec = e;
      done = true;
    });
    await(done, std::string("room to send our ") + messageName(m));
    if (ec)
      throw IoError("sending the " + std::string(messageName(m)) + " to " + peer +
                    " failed: " + ec.message());
  }

  // The next clear frame's message; FormatError if it is oversized or malformed.
  Message read(const char* expected) {
    std::array<uint8_t, 4> header{};
    bool done = false;
    boost::system::error_code ec;
    asio::async_read(socket, asio::buffer(header), [&](boost::system::error_code e, size_t) {
      ec = e;
      done = true;
    });
    await(done, expected);
    if (ec)
      throw IoError(peer + " closed the connection instead of sending its " + expected +
                    (ec == asio::error::eof ? "" : " (" + ec.message() + ")"));
    const uint32_t len = static_cast<uint32_t>(header[0]) | static_cast<uint32_t>(header[1]) << 8 |
                         static_cast<uint32_t>(header[2]) << 16 |
                         static_cast<uint32_t>(header[3]) << 24;
    if (len > kMaxClearFrameBytes)
      throw FormatError("a frame of " + std::to_string(len) + " bytes where a " + expected +
                        " was due (at most " + std::to_string(kMaxClearFrameBytes) +
                        " bytes before authentication)");
    std::vector<uint8_t> body(len);
    done = false;
    asio::async_read(socket, asio::buffer(body), [&](boost::system::error_code e, size_t) {
      ec = e;
      done = true;
    });
    await(done, expected);
    if (ec) throw IoError(peer + " closed the connection in the middle of its " + expected);
    return decodeMessage(body);
  }
};

Hello ourHello(const HandshakeOptions& o) {
  if (sodium_init() < 0) throw Error("libsodium failed to initialise");
  Hello h;
  h.version = o.version;
  h.build = o.build.substr(0, kMaxNameBytes);
  randombytes_buf(h.nonce.data(), h.nonce.size());
  return h;
}

std::string speaks(const Hello& h) {
  return "control protocol " + h.version.str() + (h.build.empty() ? "" : " (" + h.build + ")");
}

}  // namespace

std::unique_ptr<Channel> connectChannel(const Endpoint& to, const ClusterKey& key,
                                        const HandshakeOptions& options) {
  auto io = std::make_unique<asio::io_context>();
  tcp::socket socket(*io);
  Step step{*io, socket, "the node at " + to.str(), Clock::now() + options.timeout};
  {
    tcp::resolver resolver(*io);
    boost::system::error_code ec;
    bool done = false;
    tcp::resolver::results_type found;
    resolver.async_resolve(to.host, std::to_string(to.port),
                           [&](boost::system::error_code e, tcp::resolver::results_type r) {
                             ec = e;
                             found = std::move(r);
                             done = true;
                           });
    step.await(done, "address for its host name");
    if (ec) throw IoError("cannot resolve " + to.str() + ": " + ec.message());
    done = false;
    asio::async_connect(socket, found, [&](boost::system::error_code e, const tcp::endpoint&) {
      ec = e;
      done = true;
    });
    step.await(done, "connection");
    if (ec) throw IoError("cannot reach the node at " + to.str() + ": " + ec.message());
  }
  const Hello mine = ourHello(options);
  step.write(mine);
  Message m = step.read("hello");
  if (const auto* r = std::get_if<Refused>(&m))
    throw HandshakeRefused(
        r->reason, step.peer + " refused us (" + refusalName(r->reason) + "): " + r->message);
  const auto* theirs = std::get_if<Hello>(&m);
  if (!theirs) throw FormatError(step.peer + " answered our hello with '" + messageName(m) + "'");
  const Hello server = *theirs;
  if (server.version.major != mine.version.major)
    throw HandshakeRefused(Refusal::kVersion, step.peer + " speaks " + speaks(server) +
                                                  "; this build speaks " + speaks(mine) +
                                                  ": the major versions must match");
  step.write(Proof{handshakeProof(key, Side::kClient, mine, server)});
  m = step.read("proof");
  if (const auto* r = std::get_if<Refused>(&m))
    throw HandshakeRefused(
        r->reason, step.peer + " refused us (" + refusalName(r->reason) + "): " + r->message);
  const auto* proof = std::get_if<Proof>(&m);
  if (!proof) throw FormatError(step.peer + " answered our proof with '" + messageName(m) + "'");
  if (!verifyProof(key, Side::kServer, mine, server, proof->mac))
    throw HandshakeRefused(Refusal::kAuth, step.peer +
                                               " could not prove it holds the cluster key (a "
                                               "daemon of another cluster?)");
  const SessionKeys keys = sessionKeys(key, Side::kClient, mine, server);
  return startChannel(std::move(io), std::move(socket), keys, server, to.str(), options.channel);
}

namespace {

std::unique_ptr<Channel> acceptOn(std::unique_ptr<asio::io_context>& io, tcp::socket& socket,
                                  const ClusterKey& key, const HandshakeOptions& options,
                                  bool busy);

}  // namespace

std::unique_ptr<Channel> acceptChannel(std::unique_ptr<asio::io_context> io, tcp::socket socket,
                                       const ClusterKey& key, const HandshakeOptions& options,
                                       bool busy) {
  try {
    return acceptOn(io, socket, key, options, busy);
  } catch (...) {
    // Closed now, while its io_context lives: the caller destroys the arguments after the
    // call, the io_context possibly first, and an open socket's destructor reaches into it.
    boost::system::error_code ignored;
    socket.close(ignored);
    throw;
  }
}

namespace {

std::unique_ptr<Channel> acceptOn(std::unique_ptr<asio::io_context>& io, tcp::socket& socket,
                                  const ClusterKey& key, const HandshakeOptions& options,
                                  bool busy) {
  const std::string peer = peerName(socket);
  Step step{*io, socket, peer, Clock::now() + options.timeout};
  auto refuse = [&](Refusal reason, const std::string& why) {
    try {
      step.write(Refused{reason, why});
    } catch (const Error&) {  // it is gone: the log line below still says why
    }
    boost::system::error_code ignored;
    socket.close(ignored);
    throw HandshakeRefused(reason, peer + ": " + refusalName(reason) + ": " + why);
  };
  const Hello mine = ourHello(options);
  Message m;
  try {
    m = step.read("hello");
  } catch (const FormatError& e) {
    refuse(Refusal::kBadMessage, std::string("expected a hello: ") + e.what());
  }
  const auto* theirs = std::get_if<Hello>(&m);
  if (!theirs)
    refuse(Refusal::kBadMessage, std::string("expected a hello, got '") + messageName(m) + "'");
  const Hello client = *theirs;
  if (options.on_hello) options.on_hello();
  if (client.version.major != mine.version.major)
    refuse(Refusal::kVersion, "this daemon speaks " + speaks(mine) + ", the client " +
                                  speaks(client) + ": the major versions must match");
  if (busy) refuse(Refusal::kBusy, "this daemon already serves its limit of connections");
  step.write(mine);
  try {
    m = step.read("proof");
  } catch (const FormatError& e) {
    refuse(Refusal::kBadMessage, std::string("expected a proof: ") + e.what());
  }
  const auto* proof = std::get_if<Proof>(&m);
  if (!proof)
    refuse(Refusal::kBadMessage, std::string("expected a proof, got '") + messageName(m) + "'");
  if (!verifyProof(key, Side::kClient, client, mine, proof->mac))
    refuse(Refusal::kAuth, "the proof does not match this cluster's key");
  step.write(Proof{handshakeProof(key, Side::kServer, client, mine)});
  const SessionKeys keys = sessionKeys(key, Side::kServer, client, mine);
  return startChannel(std::move(io), std::move(socket), keys, client, peer, options.channel);
}

}  // namespace

std::unique_ptr<Channel> connectChannelRetrying(const Endpoint& to, const ClusterKey& key,
                                                const HandshakeOptions& options, int attempts) {
  for (int attempt = 1;; ++attempt) {
    try {
      return connectChannel(to, key, options);
    } catch (const HandshakeRefused&) {
      throw;
    } catch (const Error&) {
      if (attempt >= attempts) throw;
      std::this_thread::sleep_for(
          std::min(std::chrono::milliseconds(100) * attempt, std::chrono::milliseconds(1000)));
    }
  }
}

}  // namespace tandem::runtime

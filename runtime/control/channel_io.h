// The Asio side of channel.h, for the runtime's own files that make channels from
// sockets (handshake.cpp, daemon.cpp): users of Channel never see Asio.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>

#include "runtime/control/channel.h"
#include "runtime/control/cluster_key.h"

namespace tandem::runtime {

// A channel over `socket` (connected and authenticated, owned by `io`, which no other
// thread runs), sealing with `keys`, from now on driven by its own I/O thread.
std::unique_ptr<Channel> startChannel(std::unique_ptr<boost::asio::io_context> io,
                                      boost::asio::ip::tcp::socket socket, const SessionKeys& keys,
                                      const Hello& peer_hello, const std::string& peer,
                                      const ChannelOptions& options);

// "HOST:PORT" of a connected socket's peer ("?" if it has none).
std::string peerName(const boost::asio::ip::tcp::socket& socket);

}  // namespace tandem::runtime

namespace tandem::runtime {

struct HandshakeOptions;

// The server's side of the handshake (handshake.h) on an accepted `socket` owned by
// `io`. Refuses, with a reason sent to the peer, a hello of another major version, a
// wrong proof, a malformed or oversized frame, or `busy`; HandshakeRefused then says
// why, for the log. Timeout if the peer is too slow.
std::unique_ptr<Channel> acceptChannel(std::unique_ptr<boost::asio::io_context> io,
                                       boost::asio::ip::tcp::socket socket, const ClusterKey& key,
                                       const HandshakeOptions& options, bool busy = false);

}  // namespace tandem::runtime

// A node's network address as cluster files and daemons write it: "HOST:PORT", or
// "[IPv6]:PORT". Parsing only; nothing here opens a socket.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

struct Endpoint {
  std::string host;
  uint16_t port = 0;
  std::string str() const;
};
// InvalidArgument naming `text` if it is not HOST:PORT with a port from 1 to 65535 (0 too
// when `allow_any_port`: a listener then takes a free one).
Endpoint parseEndpoint(const std::string& text, bool allow_any_port = false);

}  // namespace tandem

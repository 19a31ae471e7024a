#include "core/endpoint.h"

#include <charconv>

#include "core/error.h"

namespace tandem {

std::string Endpoint::str() const {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

Endpoint parseEndpoint(const std::string& text, bool allow_any_port) {
  auto bad = [&](const std::string& why) -> Endpoint {
    throw InvalidArgument("'" + text + "' is not an address HOST:PORT: " + why);
  };
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("expected HOST:PORT");
  std::string host = text.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad("an IPv6 host goes in [brackets]");
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    return bad("an IPv6 host goes in [brackets]");
  }
  if (host.find_first_of(" /*[]") != std::string::npos) return bad("'" + host + "' is not a host");
  const std::string port_text = text.substr(colon + 1);
  unsigned port = 0;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port > 65535 ||
      (port == 0 && !allow_any_port))
    return bad("the port must be a number from 1 to 65535");
  return {host, static_cast<uint16_t>(port)};
}

}  // namespace tandem

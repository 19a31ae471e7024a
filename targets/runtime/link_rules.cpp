#include "targets/runtime/link_rules.h"

#include <arpa/inet.h>

#include <boost/asio/ip/address.hpp>

#include "core/error.h"

namespace tandem::runtime {

void checkBindHost(const std::string& host) {
  std::string bare = host;
  if (bare.size() > 2 && bare.front() == '[' && bare.back() == ']')
    bare = bare.substr(1, bare.size() - 2);
  boost::system::error_code ec;
  const boost::asio::ip::address a = boost::asio::ip::make_address(bare, ec);
  // inet_aton also reads the short forms ("0", "0.0") that name 0.0.0.0 to the resolver.
  in_addr v4{};
  const bool any = (!ec && a.is_unspecified()) ||
                   (inet_aton(bare.c_str(), &v4) != 0 && v4.s_addr == htonl(INADDR_ANY));
  TANDEM_CHECK_MSG(!any && !bare.empty(), InvalidArgument,
                   "links bind to one address of the node, not '"
                       << host
                       << "' (every interface): give the node's address (a cluster "
                          "file's 'host')");
}

void checkPeerEndpoint(const std::string& endpoint, const std::string& transport) {
  const std::string prefix = transport == "ipc" ? "ipc://@tandem-" : "tcp://";
  TANDEM_CHECK_MSG(endpoint.rfind(prefix, 0) == 0 && endpoint.size() > prefix.size(),
                   InvalidArgument,
                   "a " << transport << " link connects to '" << prefix
                        << "...' endpoints only, not '" << endpoint << "'");
}

}  // namespace tandem::runtime

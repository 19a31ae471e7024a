// TCP connections between processes of this machine: telling them apart from remote
// ones, and choosing their congestion control. Loopback traffic has no path to probe:
// BBR (some kernels' default) paces it by a bandwidth estimate that is noise there, so
// the socket group and the ZeroMQ links choose cubic for local connections and leave
// remote ones as they are (docs/collectives.md, docs/wire-format.md).
#pragma once

#include <string>

namespace tandem::transport {

// The connected socket's peer is on this machine: a loopback address (IPv4, IPv6 or
// IPv4-mapped), or the socket's own address. False for anything else, Unix sockets and
// unconnected sockets included.
bool peerIsLocal(int fd);

// `wanted`, then reno (which any process may choose), as the congestion control of a
// connected TCP socket whose peer is on this machine, when `wanted` is not empty; other
// sockets are left alone. Returns the congestion control the socket has afterwards (""
// if it is not a TCP socket).
std::string chooseLocalCongestion(int fd, const std::string& wanted);

// chooseLocalCongestion on every descriptor this process holds: for connections made by
// a library whose sockets we cannot reach otherwise (a benchmark's peer: Gloo, Open MPI,
// bare ZeroMQ), so that it runs under the same congestion control as ours. Returns the
// names the local TCP connections have afterwards ("cubic", "cubic, reno"; "" if none).
std::string chooseLocalCongestionForAll(const std::string& wanted);

}  // namespace tandem::transport

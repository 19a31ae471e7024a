// What a node lets a coordinator make of its data-plane links (link tasks, a stage worker's
// links): where they listen and what they connect to come from a network peer.
#pragma once

#include <string>

namespace tandem::runtime {

// InvalidArgument unless `host` names one address to listen on: not a wildcard (0.0.0.0,
// ::, or a form of them such as "0") that would open the link on every interface of the
// node.
void checkBindHost(const std::string& host);

// InvalidArgument unless `endpoint` is a peer a link of `transport` may connect to:
// "tcp://HOST:PORT" for tcp (never ipc:// or inproc://, which would reach this node's
// own sockets), "ipc://@tandem-..." (a run's abstract socket) for ipc.
void checkPeerEndpoint(const std::string& endpoint, const std::string& transport = "tcp");

}  // namespace tandem::runtime

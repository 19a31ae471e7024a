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
// own sockets); for ipc, "ipc://DIR/NAME" where DIR is another worker's socket folder
// (PrivateSocketDir: named tandem-*, a real directory of this user's, mode 0700) and NAME
// a plain name — never another of the node's Unix sockets.
void checkPeerEndpoint(const std::string& endpoint, const std::string& transport = "tcp");

// A stage worker's folder for its Unix sockets (transport: ipc): made by mkdtemp (mode
// 0700, so only this user can reach the sockets in it, unlike Linux's abstract socket
// names, which any local process can connect to) as tandem-XXXXXX under $XDG_RUNTIME_DIR
// when that is set and short enough, else /tmp; removed with what is in it when
// destroyed. A worker killed by SIGKILL leaves its empty folder behind. IoError if it
// cannot be made.
class PrivateSocketDir {
 public:
  PrivateSocketDir();
  ~PrivateSocketDir();
  PrivateSocketDir(const PrivateSocketDir&) = delete;
  PrivateSocketDir& operator=(const PrivateSocketDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace tandem::runtime

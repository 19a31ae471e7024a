// The node daemons a command works with, one path for every cluster: a node with an
// `address` is its tandemd there, reached with the cluster key; the nodes of a cluster
// without addresses (the local default) are this machine, and each gets a tandemd started
// on loopback for the command, with a key made for it. `tandem run`, `infer`, `profile
// --links` and `partition: auto` all start from here.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/profile/link_probe.h"
#include "core/profile/profile.h"
#include "partitioner/cluster.h"
#include "runtime/control/channel.h"
#include "runtime/daemon/local_daemon.h"
#include "runtime/job/coordinator.h"

namespace tandem::runtime {

class ClusterDaemons {
 public:
  // `key_file` overrides the cluster file's `key`. Local daemons run `tandemd_program`.
  // InvalidArgument naming the node when some nodes have an address and others not, a node
  // without one is not on loopback, or a cluster with addresses has no key.
  ClusterDaemons(const partitioner::Cluster& cluster, const std::string& key_file,
                 const std::string& tandemd_program);
  ~ClusterDaemons();
  ClusterDaemons(const ClusterDaemons&) = delete;
  ClusterDaemons& operator=(const ClusterDaemons&) = delete;

  const partitioner::Cluster& cluster() const { return cluster_; }
  const std::vector<DaemonNode>& nodes() const { return nodes_; }
  const ClusterKey& key() const { return key_; }
  bool remote() const { return remote_; }  // some node is off this machine's loopback
  // The daemons were started here (a cluster without addresses), with a key of their own.
  bool onThisMachine() const { return !local_.empty(); }

  // A session with every node for tasks (profiles, link measurements): connected,
  // authenticated, node info both ways (`who` names this side in the daemons' logs).
  // Error naming the node and its address that cannot be reached within `timeout`.
  std::vector<std::unique_ptr<Channel>> connect(const std::string& who,
                                                std::chrono::seconds timeout) const;

 private:
  partitioner::Cluster cluster_;
  std::vector<DaemonNode> nodes_;
  ClusterKey key_;
  bool remote_ = false;
  std::vector<std::unique_ptr<LocalDaemon>> local_;
};

// Says `leave` on every session and closes it; a node gone already is passed over.
void leaveAll(std::vector<std::unique_ptr<Channel>>& sessions, const std::string& reason);

// This machine as the cluster `tandem run` uses without a cluster file: one node, "local",
// with `devices` CPU devices of `threads` threads (one per stage), linked by loopback.
partitioner::Cluster localCluster(int devices, int threads);

// Link measurement between nodes with the real transport: each node's daemon opens
// links where that node's stages would (its `host`) and measures against another node
// (core/profile/link_probe.h) over a SocketLink, told by `link task`s. `pairs` lists the
// ordered pairs of node indices to measure (from == to: within the node, two links of one
// daemon), one after another. Error naming the node that failed or did not answer.
struct LinkSurveyOptions {
  LinkProbeOptions probe;  // its `load` aside: the daemons make their own
  // Whether each pair also runs loaded runs (core/profile/link_probe.h): the link's CPU
  // per byte is then what its messages cost both ends while they compute, where higher.
  bool loaded = true;
  std::chrono::seconds timeout{30};  // for each node's answer
};
LinkSet surveyLinks(const ClusterDaemons& daemons, std::vector<std::unique_ptr<Channel>>& sessions,
                    const std::vector<std::pair<size_t, size_t>>& pairs,
                    const LinkSurveyOptions& options);
// Every ordered pair, within each node too.
std::vector<std::pair<size_t, size_t>> allLinkPairs(size_t nodes);

}  // namespace tandem::runtime

// Cluster files: the nodes, their devices, and the links between nodes. With a model and
// the profiles measured on the nodes, makeProblem() turns one into the partitioner's
// Problem.
//
//   key: cluster.key                 # the cluster key (`tandem keygen --cluster`)
//   nodes:
//     - name: edge
//       address: 10.0.0.5:7600       # its daemon, `tandemd --listen` (none: a local node)
//       host: 10.0.0.5               # where its stages listen (default: the address's
//                                    # host, else 127.0.0.1)
//       profile: edge.json           # measured there by `tandem profile` (optional)
//       devices:
//         - {name: cpu, backend: cpu, threads: 2, memory: 1GiB}
//     - name: cloud
//       devices:
//         - {name: gpu, backend: opencl:0}       # memory: the profile's
//   links:
//     measured: links.json                        # by `tandem profile --links` (optional)
//     local: {bandwidth: 5GB/s, latency: 20us}    # between stages on one node
//     default: {bandwidth: 1Gbit/s, latency: 1ms} # between nodes not listed below
//     between:
//       - {from: edge, to: cloud, bandwidth: 100Mbit/s, latency: 20ms}  # both ways
//
// A link is, by precedence: listed under `between`, else measured, else `local` or
// `default`.
//
// A device's times come from the device named `profile_device` (default: its backend)
// in its own `profile` file, else its node's, else the one given to `tandem partition`.
// Paths are relative to the cluster file. Errors name the file, line and column.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/endpoint.h"
#include "core/model.h"
#include "core/profile/profile.h"
#include "partitioner/problem.h"

namespace tandem::partitioner {

struct ClusterDevice {
  std::string name, backend = "cpu";
  int threads = 1;
  int64_t memory_bytes = 0;  // 0: as the profile reports
  std::string profile, profile_device;
  std::string where;
};

struct ClusterNode {
  std::string name, profile;
  std::optional<Endpoint> address;  // its daemon's control address
  std::string host = "127.0.0.1";
  std::vector<ClusterDevice> devices;
  std::string where;
};

struct ClusterLink {
  std::string from, to;
  LinkCosts link;
  std::string where;
};

struct Cluster {
  std::string source;
  std::string key;  // the cluster key file, by path (empty: none named)
  std::vector<ClusterNode> nodes;
  std::optional<LinkCosts> local, fallback;  // `local` and `default`
  std::vector<ClusterLink> between;          // each both ways
  std::string measured;                      // a profile with links, by path
  std::string measured_where;                // "cluster.yaml:12:13", for messages
};

Cluster parseCluster(const std::string& yaml_text, const std::string& source = "<string>");
Cluster loadCluster(const std::string& path);

// Every profile file the cluster names (with `links.measured`), and `default_profile`
// (may be empty), by path.
std::vector<std::string> profilePaths(const Cluster& c, const std::string& default_profile);

// The model's half of a problem: its layers' bytes at the options' microbatch size, and
// the options; no devices or links yet.
Problem modelProblem(const Model& model, const CostOptions& options);

// The partitioner's problem for `model` on `cluster`: per-layer times from the profiles
// (by path), scaled from the profile's batch to the microbatch size, with the loss added
// to the last layer; bytes from the model; links as above. InvalidArgument names the
// cluster entry or profile that does not fit the model or the cluster.
Problem makeProblem(const Model& model, const Cluster& cluster,
                    const std::map<std::string, Profile>& profiles,
                    const std::string& default_profile, const CostOptions& options);

}  // namespace tandem::partitioner

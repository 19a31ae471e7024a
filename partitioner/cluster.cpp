#include "partitioner/cluster.h"

#include <filesystem>
#include <set>
#include <tuple>
#include <utility>

#include "core/endpoint.h"
#include "core/error.h"
#include "core/file.h"
#include "core/yaml_reader.h"

namespace tandem::partitioner {

namespace {

std::string resolve(const std::string& source, const std::string& path) {
  const std::filesystem::path dir = std::filesystem::path(source).parent_path();
  if (path.empty() || std::filesystem::path(path).is_absolute() || dir.empty()) return path;
  return (dir / path).lexically_normal().string();
}

LinkCosts parseLink(const YamlReader& r, const YAML::Node& node, const std::string& what) {
  if (!node.IsMap()) r.fail(node, what + " must be a map {bandwidth: ..., latency: ...}");
  LinkCosts l;
  bool have_bandwidth = false;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (key == "bandwidth") {
      l.bandwidth = r.rate(kv.second, key);
      have_bandwidth = true;
    } else if (key == "latency") {
      l.latency_s = r.seconds(kv.second, key);
    } else if (key != "from" && key != "to") {
      r.fail(kv.first, "unknown link key '" + key + "' (expected bandwidth, latency)");
    }
  }
  if (!have_bandwidth) r.fail(node, what + " needs a 'bandwidth'");
  return l;
}

ClusterDevice parseDevice(const YamlReader& r, const YAML::Node& node) {
  if (!node.IsMap()) r.fail(node, "a device is a map {name, backend, threads, memory}");
  ClusterDevice d;
  d.where = r.at(node);
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (key == "name") {
      d.name = r.get<std::string>(v, key, "a name");
    } else if (key == "backend") {
      d.backend = r.get<std::string>(v, key, "cpu or opencl:N");
      if (d.backend != "cpu" && d.backend.rfind("opencl:", 0) != 0)
        r.fail(v, "unknown backend '" + d.backend + "' (expected cpu or opencl:N)");
    } else if (key == "threads") {
      d.threads = static_cast<int>(r.positive(v, key));
    } else if (key == "memory") {
      d.memory_bytes = r.bytes(v, key);
    } else if (key == "profile") {
      d.profile = resolve(r.source(), r.get<std::string>(v, key, "a profile file"));
    } else if (key == "profile_device") {
      d.profile_device = r.get<std::string>(v, key, "a device name in the profile");
    } else {
      r.fail(kv.first, "unknown device key '" + key +
                           "' (expected name, backend, threads, memory, profile, profile_device)");
    }
  }
  if (d.name.empty()) d.name = d.backend;
  if (d.profile_device.empty()) d.profile_device = d.backend;
  return d;
}

}  // namespace

Cluster parseCluster(const std::string& yaml_text, const std::string& source) {
  const YamlReader r(source);
  const YAML::Node root = r.load(yaml_text);
  if (!root.IsMap()) throw InvalidArgument(source + ": a cluster file is a map with 'nodes'");
  Cluster c;
  c.source = source;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (key == "nodes") {
      if (!v.IsSequence() || v.size() == 0) r.fail(v, "'nodes' must be a non-empty list");
      for (const YAML::Node& n : v) {
        if (!n.IsMap()) r.fail(n, "a node is a map {name, devices, profile}");
        ClusterNode node;
        node.where = r.at(n);
        for (const auto& nkv : n) {
          const std::string nkey = nkv.first.as<std::string>();
          if (nkey == "name") {
            node.name = r.get<std::string>(nkv.second, nkey, "a name");
          } else if (nkey == "host") {
            node.host = r.get<std::string>(nkv.second, nkey, "a host name or address");
            if (node.host.empty() || node.host.find_first_of(" /:*") != std::string::npos)
              r.fail(nkv.second, "'" + node.host + "' is not a host name or address");
          } else if (nkey == "address") {
            const std::string text = r.get<std::string>(nkv.second, nkey, "HOST:PORT");
            try {
              node.address = parseEndpoint(text);
            } catch (const InvalidArgument& e) {
              r.fail(nkv.second, e.what());
            }
          } else if (nkey == "profile") {
            node.profile = resolve(source, r.get<std::string>(nkv.second, nkey, "a file"));
          } else if (nkey == "devices") {
            if (!nkv.second.IsSequence() || nkv.second.size() == 0)
              r.fail(nkv.second, "'devices' must be a non-empty list");
            for (const YAML::Node& d : nkv.second) node.devices.push_back(parseDevice(r, d));
          } else {
            r.fail(nkv.first, "unknown node key '" + nkey +
                                  "' (expected name, address, host, profile, devices)");
          }
        }
        if (node.name.empty()) r.fail(n, "the node has no 'name'");
        if (node.address && !n["host"]) node.host = node.address->host;
        if (node.devices.empty()) r.fail(n, "node '" + node.name + "' has no 'devices'");
        for (const ClusterNode& other : c.nodes) {
          if (other.name == node.name) r.fail(n, "a second node named '" + node.name + "'");
          if (node.address && other.address && node.address->str() == other.address->str())
            r.fail(n["address"], "node '" + node.name + "' has the address of node '" + other.name +
                                     "' (" + node.address->str() + ")");
        }
        std::set<std::string> names;
        for (const ClusterDevice& d : node.devices)
          if (!names.insert(d.name).second)
            throw InvalidArgument(d.where + ": a second device named '" + d.name + "' on node '" +
                                  node.name + "'");
        c.nodes.push_back(std::move(node));
      }
    } else if (key == "links") {
      if (!v.IsMap()) r.fail(v, "'links' must be a map {local, default, between}");
      for (const auto& lkv : v) {
        const std::string lkey = lkv.first.as<std::string>();
        if (lkey == "local") {
          c.local = parseLink(r, lkv.second, "'local'");
        } else if (lkey == "default") {
          c.fallback = parseLink(r, lkv.second, "'default'");
        } else if (lkey == "measured") {
          c.measured = resolve(source, r.get<std::string>(lkv.second, lkey, "a profile file"));
          c.measured_where = r.at(lkv.second);
        } else if (lkey == "between") {
          if (!lkv.second.IsSequence()) r.fail(lkv.second, "'between' must be a list of links");
          for (const YAML::Node& l : lkv.second) {
            if (!l.IsMap() || !l["from"] || !l["to"])
              r.fail(l, "a link is a map {from, to, bandwidth, latency}");
            c.between.push_back({r.get<std::string>(l["from"], "from", "a node name"),
                                 r.get<std::string>(l["to"], "to", "a node name"),
                                 parseLink(r, l, "a link"), r.at(l)});
          }
        } else {
          r.fail(lkv.first,
                 "unknown links key '" + lkey + "' (expected measured, local, default, between)");
        }
      }
    } else if (key == "key") {
      c.key = resolve(source, r.get<std::string>(v, key, "the cluster key file"));
    } else {
      r.fail(kv.first, "unknown key '" + key + "' (expected nodes, links, key)");
    }
  }
  if (c.nodes.empty()) throw InvalidArgument(source + ": the cluster has no 'nodes'");
  for (const ClusterLink& l : c.between)
    for (const std::string& end : {l.from, l.to}) {
      bool known = false;
      for (const ClusterNode& n : c.nodes) known = known || n.name == end;
      TANDEM_CHECK_MSG(known, InvalidArgument,
                       l.where << ": link names node '" << end << "', which the cluster lacks");
    }
  return c;
}

Cluster loadCluster(const std::string& path) {
  return parseCluster(readFile(path, "cluster file"), path);
}

std::vector<std::string> profilePaths(const Cluster& c, const std::string& default_profile) {
  std::set<std::string> paths;
  if (!default_profile.empty()) paths.insert(default_profile);
  if (!c.measured.empty()) paths.insert(c.measured);
  for (const ClusterNode& n : c.nodes) {
    if (!n.profile.empty()) paths.insert(n.profile);
    for (const ClusterDevice& d : n.devices)
      if (!d.profile.empty()) paths.insert(d.profile);
  }
  return {paths.begin(), paths.end()};
}

static_assert(static_cast<int>(TensorKind::kColumn) == TensorRole::kColumn &&
              static_cast<int>(TensorKind::kRow) == TensorRole::kRow &&
              static_cast<int>(TensorKind::kSlice) == TensorRole::kSlice &&
              static_cast<int>(TensorKind::kBlock) == TensorRole::kBlock);

Problem modelProblem(const Model& model, const CostOptions& options) {
  Problem p;
  p.options = options;
  const int64_t b = options.microbatch_size;
  for (size_t l = 0; l < model.size(); ++l) {
    const Layer& layer = model.layer(l);
    p.layers.push_back({layer.type(), layer.paramBytes(), layer.outputBytes() * b,
                        layer.stashBytes() * b, layer.workspaceBytes(b)});
    const std::vector<TensorRole> own = model.tensorRoles(l, l + 1);
    if (own.front().kind == TensorRole::kBlock)
      p.layers.back().tensor_allreduces = model.tensorAllreduces(own);
  }
  p.input_bytes = model.inputShape().numel() * 4 * b;
  // What a split from each first layer makes of the layers after it (tensor_roles).
  for (size_t first = 0; first < model.size(); ++first) {
    std::vector<TensorKind> kinds;
    for (const TensorRole& r : model.tensorRoles(first, model.size()))
      kinds.push_back(static_cast<TensorKind>(r.kind));
    p.tensor_roles.push_back(std::move(kinds));
  }
  return p;
}

namespace {

// A measured link's costs; a sender's part not measured is half.
LinkCosts linkCosts(const LinkProfile& l) {
  return {l.bandwidth, l.latency_s, l.cpu_s_per_byte, l.sender_share > 0 ? l.sender_share : 0.5};
}

// The line through two points (bytes, seconds) — one point: a fixed cost —, never negative:
// {fixed, per byte}.
std::pair<double, double> lineThrough(int64_t a_bytes, double a_s, int64_t z_bytes, double z_s) {
  const double per_byte =
      z_bytes > a_bytes ? std::max(0.0, (z_s - a_s) / static_cast<double>(z_bytes - a_bytes)) : 0;
  return {std::max(0.0, a_s - per_byte * static_cast<double>(a_bytes)), per_byte};
}

// The line through a node's smallest and largest measured messages.
MessageCpuCost messageCpuCost(const std::vector<MessageCpu>& points) {
  const MessageCpu &a = points.front(), &z = points.back();
  MessageCpuCost c;
  std::tie(c.fixed_s, c.per_byte_s) = lineThrough(a.bytes, a.cpu_s, z.bytes, z.cpu_s);
  std::tie(c.send_fixed_s, c.send_per_byte_s) = lineThrough(a.bytes, a.send_s, z.bytes, z.send_s);
  return c;
}

// The line through a node's smallest and largest measured all-reduces.
GroupAllreduceCost groupAllreduceCost(const std::vector<GroupAllreduce>& points) {
  const GroupAllreduce &a = points.front(), &z = points.back();
  GroupAllreduceCost c;
  std::tie(c.fixed_s, c.per_byte_s) = lineThrough(a.bytes, a.seconds, z.bytes, z.seconds);
  return c;
}

// Every ordered pair of the cluster's nodes' link: `local` within a node, `default`
// between nodes, the cluster's measured profile's links over those, then `between`;
// InvalidArgument for a pair with none, or a measurement of a node the cluster lacks.
std::vector<std::vector<LinkCosts>> linkCosts(const Cluster& cluster,
                                              const std::map<std::string, Profile>& profiles) {
  const size_t nodes = cluster.nodes.size();
  // `local` within a node, `default` between nodes, then `between` over both.
  std::vector<std::vector<std::optional<LinkCosts>>> links(nodes);
  for (size_t a = 0; a < nodes; ++a)
    for (size_t z = 0; z < nodes; ++z)
      links[a].push_back(a == z ? cluster.local : cluster.fallback);
  auto nodeIndex = [&](const std::string& name) {
    for (size_t i = 0; i < nodes; ++i)
      if (cluster.nodes[i].name == name) return i;
    return nodes;  // parseCluster checked the names
  };
  if (!cluster.measured.empty()) {
    const auto it = profiles.find(cluster.measured);
    TANDEM_CHECK_MSG(
        it != profiles.end(), InvalidArgument,
        cluster.measured_where << ": profile " << cluster.measured << " was not loaded");
    TANDEM_CHECK_MSG(it->second.links.has_value(), InvalidArgument,
                     cluster.measured_where
                         << ": " << cluster.measured
                         << " holds no links (measure them with tandem profile --links)");
    // A link measured one way serves both ways, unless the other way was measured too:
    // every measurement mirrored first, then each in its own direction.
    for (const LinkProfile& l : it->second.links->links) {
      const size_t a = nodeIndex(l.from), z = nodeIndex(l.to);
      TANDEM_CHECK_MSG(a < nodes && z < nodes, InvalidArgument,
                       cluster.measured << ": a link from '" << l.from << "' to '" << l.to
                                        << "', but the cluster " << cluster.source
                                        << " has no node '" << (a < nodes ? l.to : l.from) << "'");
      links[z][a] = linkCosts(l);  // the sender's part is the sending role's, either way
    }
    for (const LinkProfile& l : it->second.links->links)
      links[nodeIndex(l.from)][nodeIndex(l.to)] = linkCosts(l);
  }
  for (const ClusterLink& l : cluster.between) {
    const size_t a = nodeIndex(l.from), z = nodeIndex(l.to);
    links[a][z] = links[z][a] = l.link;
  }
  std::vector<std::vector<LinkCosts>> out(nodes, std::vector<LinkCosts>(nodes));
  for (size_t a = 0; a < nodes; ++a)
    for (size_t z = 0; z < nodes; ++z) {
      TANDEM_CHECK_MSG(links[a][z].has_value(), InvalidArgument,
                       cluster.source << ": no link " << (a == z ? "within" : "between")
                                      << " node '" << cluster.nodes[a].name << "'"
                                      << (a == z ? "" : " and '" + cluster.nodes[z].name + "'")
                                      << ": give links." << (a == z ? "local" : "default")
                                      << " or list it under links.between");
      out[a][z] = *links[a][z];
    }
  return out;
}

}  // namespace

Problem makeProblem(const Model& model, const Cluster& cluster,
                    const std::map<std::string, Profile>& profiles,
                    const std::string& default_profile, const CostOptions& options) {
  Problem p = modelProblem(model, options);
  const int64_t b = options.microbatch_size;

  for (const ClusterNode& n : cluster.nodes) p.node_names.push_back(n.name);
  const size_t nodes = cluster.nodes.size();
  p.links = linkCosts(cluster, profiles);

  p.node_cores.assign(nodes, 0);
  p.node_message_cpu.assign(nodes, {});
  p.node_group_allreduce.assign(nodes, {});
  int64_t param_bytes = 0;  // the model's, which a profile's update_s updated
  for (const LayerBytes& l : p.layers) param_bytes += l.param_bytes;
  for (size_t ni = 0; ni < nodes; ++ni) {
    const ClusterNode& n = cluster.nodes[ni];
    for (const ClusterDevice& cd : n.devices) {
      const std::string path = !cd.profile.empty()  ? cd.profile
                               : !n.profile.empty() ? n.profile
                                                    : default_profile;
      TANDEM_CHECK_MSG(!path.empty(), InvalidArgument,
                       cd.where << ": device '" << cd.name
                                << "' has no profile (give --profile or 'profile:' in the "
                                   "cluster file)");
      const auto it = profiles.find(path);
      TANDEM_CHECK_MSG(it != profiles.end(), InvalidArgument,
                       cd.where << ": profile " << path << " was not loaded");
      const Profile& prof = it->second;
      const DeviceProfile& dp =
          deviceProfile(prof, model, cd.profile_device, cd.where + ": profile " + path);
      DeviceCosts d;
      d.name = n.name + "/" + cd.name;
      d.node = static_cast<int>(ni);
      d.memory_bytes = cd.memory_bytes > 0 ? cd.memory_bytes : dp.device.memory_bytes;
      d.backend = cd.backend;
      d.threads = cd.threads;
      // Times grow in proportion to the batch: profile at the microbatch size for the
      // best prediction. And a device is priced at what it sustains over time, not at
      // what it bursts to (a CPU quota, throttling: Sustained in core/profile/profile.h).
      const double scale =
          static_cast<double>(b) / static_cast<double>(dp.batchIn(prof)) * dp.sustained.throttle();
      const bool training = options.objective == Objective::kTrainThroughput;
      for (const LayerProfile& lp : dp.layers) {
        d.forward_s.push_back(lp.forward.median * scale);
        d.backward_s.push_back(lp.backward.median * scale);
        // What its backend lacks for the layer (serving needs the forward's ops only).
        const bool lacks = !lp.lacks.empty() && (training || !lp.forward_runs);
        d.lacks.push_back(lacks ? "lacks " + opUseNames(lp.lacks) : "");
        if (lp.backward_no_input.repeats > 0)
          d.first_backward_s = lp.backward_no_input.median * scale;
        // Decoding a token does not depend on the batch: only on what the device sustains.
        if (dp.decodes()) {
          d.decode_s.push_back(lp.decode.median * dp.sustained.throttle());
          d.decode_batch_s.push_back(lp.decode_batch.median * dp.sustained.throttle());
          d.cache_bytes.push_back(lp.cache_bytes);
        }
      }
      if (dp.decodes()) d.decode_batch = dp.decode_batch;
      // The loss runs on the last stage, with the last layer; training pays for it.
      if (options.objective == Objective::kTrainThroughput)
        d.forward_s.back() += dp.loss.median * scale;
      // The update runs once per step over the stage's parameters; profiles before
      // version 4 did not measure it. It runs for milliseconds, long enough for a CPU
      // quota to stall it (most of its repeats on a quarter-core node): there its fastest
      // repeat is its burst speed, which the throttle then scales like the layers'.
      const auto update = dp.update.find(options.optimizer);
      if (options.objective == Objective::kTrainThroughput && update != dp.update.end() &&
          param_bytes > 0) {
        const Spread& u = update->second;
        const double burst = dp.sustained.quota_cores > 0 ? u.min : u.median;
        d.update_s_per_param_byte =
            burst * dp.sustained.throttle() / static_cast<double>(param_bytes);
      }
      // Under a CPU quota the layers' medians are its burst speed, and it keeps up the
      // sustained rate's share of each period at that speed.
      const Sustained& su = dp.sustained;
      if (su.quota_cores > 0 && su.quota_period_s > 0 && su.throttle() > 1) {
        d.burst_ratio = 1 / su.throttle();
        d.burst_budget_s = d.burst_ratio * su.quota_period_s;
      }
      // A device measured alone on the host's cores shares them with the node's other
      // stages when the job runs; one measured with its neighbours training beside it
      // (`load`) has that in its times already.
      if (dp.device.host_cores && prof.load == 0)
        d.host_threads = dp.device.kind == "cpu" ? cd.threads : dp.device.compute_units;
      p.node_cores[ni] = std::max(p.node_cores[ni], su.cpu_cores);
      if (!prof.message_cpu.empty()) p.node_message_cpu[ni] = messageCpuCost(prof.message_cpu);
      if (!prof.group_allreduce.empty())
        p.node_group_allreduce[ni] = groupAllreduceCost(prof.group_allreduce);
      p.devices.push_back(std::move(d));
    }
  }
  validate(p);
  return p;
}

}  // namespace tandem::partitioner

#include "partitioner/cost_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace tandem::partitioner {

const char* objectiveName(Objective o) {
  switch (o) {
    case Objective::kTrainThroughput:
      return "train";
    case Objective::kInferThroughput:
      return "infer";
    case Objective::kInferLatency:
      return "latency";
  }
  return "?";
}

Objective parseObjective(const std::string& name) {
  if (name == "train") return Objective::kTrainThroughput;
  if (name == "infer") return Objective::kInferThroughput;
  if (name == "latency") return Objective::kInferLatency;
  throw InvalidArgument("unknown objective '" + name + "' (expected train, infer or latency)");
}

void validate(const Problem& p) {
  const size_t layers = p.layers.size(), nodes = p.node_names.size();
  TANDEM_CHECK_MSG(layers > 0, InvalidArgument, "the model has no layers to place");
  TANDEM_CHECK_MSG(!p.devices.empty(), InvalidArgument, "the cluster has no devices");
  TANDEM_CHECK_MSG(p.links.size() == nodes, InvalidArgument,
                   "the link matrix has " << p.links.size() << " rows for " << nodes << " nodes");
  for (size_t a = 0; a < nodes; ++a) {
    TANDEM_CHECK_MSG(p.links[a].size() == nodes, InvalidArgument,
                     "link matrix row " << a << " has " << p.links[a].size() << " entries for "
                                        << nodes << " nodes");
    for (size_t b = 0; b < nodes; ++b) {
      const LinkCosts& l = p.links[a][b];
      TANDEM_CHECK_MSG(l.bandwidth > 0 && l.latency_s >= 0, InvalidArgument,
                       "link " << p.node_names[a] << " -> " << p.node_names[b] << " has bandwidth "
                               << l.bandwidth << " B/s and latency " << l.latency_s << " s");
      TANDEM_CHECK_MSG(l.cpu_s_per_byte >= 0 && std::isfinite(l.cpu_s_per_byte), InvalidArgument,
                       "link " << p.node_names[a] << " -> " << p.node_names[b] << " costs "
                               << l.cpu_s_per_byte << " s of CPU per byte");
      TANDEM_CHECK_MSG(l.sender_share >= 0 && l.sender_share <= 1, InvalidArgument,
                       "link " << p.node_names[a] << " -> " << p.node_names[b]
                               << " charges its sender " << l.sender_share
                               << " of its CPU (a share in [0, 1])");
    }
  }
  for (const DeviceCosts& d : p.devices) {
    TANDEM_CHECK_MSG(d.node >= 0 && static_cast<size_t>(d.node) < nodes, InvalidArgument,
                     "device " << d.name << " is on node " << d.node << " of " << nodes);
    TANDEM_CHECK_MSG(d.memory_bytes > 0, InvalidArgument,
                     "device " << d.name << " has " << d.memory_bytes << " bytes of memory");
    TANDEM_CHECK_MSG(d.forward_s.size() == layers && d.backward_s.size() == layers, InvalidArgument,
                     "device " << d.name << " has times for " << d.forward_s.size()
                               << " layers, the model has " << layers);
    for (size_t l = 0; l < layers; ++l)
      TANDEM_CHECK_MSG(d.forward_s[l] >= 0 && d.backward_s[l] >= 0, InvalidArgument,
                       "device " << d.name << " has a negative time for layer " << l);
    TANDEM_CHECK_MSG(d.lacks.empty() || d.lacks.size() == layers, InvalidArgument,
                     "device " << d.name << " says what it lacks for " << d.lacks.size()
                               << " layers, the model has " << layers);
    const bool decodes = !d.decode_s.empty();
    TANDEM_CHECK_MSG(!decodes || (d.decode_s.size() == layers &&
                                  d.decode_batch_s.size() == layers && d.decode_batch >= 1),
                     InvalidArgument,
                     "device " << d.name << " has decoding times for " << d.decode_s.size()
                               << " and " << d.decode_batch_s.size() << " layers at "
                               << d.decode_batch << " sequences, the model has " << layers);
    TANDEM_CHECK_MSG(d.update_s_per_param_byte >= 0, InvalidArgument,
                     "device " << d.name << " has a negative update time");
    TANDEM_CHECK_MSG(d.host_threads >= 0, InvalidArgument,
                     "device " << d.name << " keeps " << d.host_threads << " host threads busy");
    TANDEM_CHECK_MSG(d.burst_ratio > 0 && d.burst_ratio <= 1 && d.burst_budget_s >= 0,
                     InvalidArgument,
                     "device " << d.name << " bursts at " << d.burst_ratio << " of its times for "
                               << d.burst_budget_s << " s (a ratio in (0, 1], a budget >= 0)");
  }
  TANDEM_CHECK_MSG(p.node_cores.empty() || p.node_cores.size() == nodes, InvalidArgument,
                   "cores for " << p.node_cores.size() << " of " << nodes << " nodes");
  for (const double c : p.node_cores)
    TANDEM_CHECK_MSG(c >= 0, InvalidArgument, "a node with " << c << " cores");
  TANDEM_CHECK_MSG(
      p.node_message_cpu.empty() || p.node_message_cpu.size() == nodes, InvalidArgument,
      "message costs for " << p.node_message_cpu.size() << " of " << nodes << " nodes");
  for (const MessageCpuCost& m : p.node_message_cpu)
    TANDEM_CHECK_MSG(
        m.fixed_s >= 0 && m.per_byte_s >= 0 && m.send_fixed_s >= 0 && m.send_per_byte_s >= 0,
        InvalidArgument,
        "a message costing " << m.fixed_s << " s and " << m.per_byte_s << " s per byte of CPU");
  TANDEM_CHECK_MSG(p.node_group_allreduce.empty() || p.node_group_allreduce.size() == nodes,
                   InvalidArgument,
                   "group all-reduce costs for " << p.node_group_allreduce.size() << " of " << nodes
                                                 << " nodes");
  for (const GroupAllreduceCost& g : p.node_group_allreduce)
    TANDEM_CHECK_MSG(
        g.fixed_s >= 0 && g.per_byte_s >= 0 && std::isfinite(g.fixed_s) &&
            std::isfinite(g.per_byte_s),
        InvalidArgument,
        "a group all-reduce costing " << g.fixed_s << " s and " << g.per_byte_s << " s per byte");
  TANDEM_CHECK_MSG(
      p.tensor_roles.empty() || p.tensor_roles.size() == layers, InvalidArgument,
      "tensor roles from " << p.tensor_roles.size() << " first layers, the model has " << layers);
  for (size_t b = 0; b < p.tensor_roles.size(); ++b)
    TANDEM_CHECK_MSG(p.tensor_roles[b].size() == layers - b, InvalidArgument,
                     "the tensor roles from layer " << b << " name " << p.tensor_roles[b].size()
                                                    << " layers, not " << layers - b);
  const CostOptions& o = p.options;
  TANDEM_CHECK_MSG(o.max_tensor >= 1 && o.max_tensor <= 64, InvalidArgument,
                   "max_tensor is " << o.max_tensor << " (1 to 64)");
  TANDEM_CHECK_MSG(o.microbatches >= 1 && o.microbatch_size >= 1, InvalidArgument,
                   o.microbatches << " microbatches of " << o.microbatch_size << " samples");
  TANDEM_CHECK_MSG(o.max_replicas >= 1, InvalidArgument, "max_replicas is " << o.max_replicas);
  TANDEM_CHECK_MSG(
      o.source < static_cast<int>(p.devices.size()), InvalidArgument,
      "the source device " << o.source << " is not one of the " << p.devices.size() << " devices");
}

CostModel::CostModel(Problem problem) : problem_(std::move(problem)) {
  validate(problem_);
  const auto& devs = problem_.devices;
  const size_t n = layers();
  type_of_.assign(devs.size(), -1);
  for (size_t d = 0; d < devs.size(); ++d) {
    for (size_t t = 0; t < types_.size(); ++t) {
      const DeviceCosts& r = devs[static_cast<size_t>(types_[t].devices.front())];
      if (r.node == devs[d].node && r.memory_bytes == devs[d].memory_bytes &&
          r.forward_s == devs[d].forward_s && r.backward_s == devs[d].backward_s &&
          r.first_backward_s == devs[d].first_backward_s && r.burst_ratio == devs[d].burst_ratio &&
          r.burst_budget_s == devs[d].burst_budget_s && r.host_threads == devs[d].host_threads &&
          r.update_s_per_param_byte == devs[d].update_s_per_param_byte &&
          r.lacks == devs[d].lacks && r.decode_s == devs[d].decode_s &&
          r.decode_batch_s == devs[d].decode_batch_s) {
        types_[t].devices.push_back(static_cast<int>(d));
        type_of_[d] = static_cast<int>(t);
        break;
      }
    }
    if (type_of_[d] < 0) {
      type_of_[d] = static_cast<int>(types_.size());
      types_.push_back({{static_cast<int>(d)}, devs[d].node, devs[d].memory_bytes});
    }
  }
  first_param_ = n;
  for (size_t l = 0; l < n && first_param_ == n; ++l)
    if (problem_.layers[l].param_bytes > 0) first_param_ = l;
  for (const DeviceType& t : types_) {
    const DeviceCosts& d = devs[static_cast<size_t>(t.devices.front())];
    const size_t p = first_param_;
    first_backward_.push_back(p == n                    ? 0
                              : p == 0                  ? d.backward_s[0]
                              : d.first_backward_s >= 0 ? d.first_backward_s
                                                        : 0.5 * d.backward_s[p]);
    std::vector<double> prefix(n + 1, 0), f(n + 1, 0), b(n + 1, 0), w(n + 1, 0);
    for (size_t l = 0; l < n; ++l) {
      prefix[l + 1] = prefix[l] + d.forward_s[l] + (training() ? d.backward_s[l] : 0);
      f[l + 1] = f[l] + d.forward_s[l];
      b[l + 1] = b[l] + d.backward_s[l];
      w[l + 1] = w[l] + (problem_.layers[l].param_bytes > 0 ? 0.5 * d.backward_s[l] : 0.0);
    }
    std::vector<int> lack(n + 1, 0);
    for (size_t l = 0; l < n; ++l)
      lack[l + 1] = lack[l] + (!d.lacks.empty() && !d.lacks[l].empty() ? 1 : 0);
    lack_prefix_.push_back(std::move(lack));
    time_prefix_.push_back(std::move(prefix));
    forward_prefix_.push_back(std::move(f));
    backward_prefix_.push_back(std::move(b));
    weight_prefix_.push_back(std::move(w));
  }
  param_prefix_.assign(n + 1, 0);
  stash_prefix_.assign(n + 1, 0);
  for (size_t l = 0; l < n; ++l) {
    param_prefix_[l + 1] = param_prefix_[l] + problem_.layers[l].param_bytes;
    stash_prefix_[l + 1] = stash_prefix_[l] + problem_.layers[l].stash_bytes;
  }
  std::vector<int64_t> working, backward;
  for (size_t l = 0; l < n; ++l) {
    working.push_back(inputBytes(l) + problem_.layers[l].output_bytes +
                      problem_.layers[l].workspace_bytes);
    backward.push_back(stash_prefix_[l + 1] + working.back());
  }
  working_max_ = rangeMaxTable(std::move(working));
  backward_max_ = rangeMaxTable(std::move(backward));
}

std::vector<std::vector<int64_t>> CostModel::rangeMaxTable(std::vector<int64_t> values) {
  std::vector<std::vector<int64_t>> table{std::move(values)};
  const size_t n = table[0].size();
  for (size_t w = 1; (size_t{1} << w) <= n; ++w) {
    const auto& prev = table[w - 1];
    std::vector<int64_t> level;
    for (size_t l = 0; l + (size_t{1} << w) <= n; ++l)
      level.push_back(std::max(prev[l], prev[l + (size_t{1} << (w - 1))]));
    table.push_back(std::move(level));
  }
  return table;
}

int64_t CostModel::rangeMax(const std::vector<std::vector<int64_t>>& table, size_t begin,
                            size_t end) {
  const auto w = static_cast<size_t>(std::bit_width(end - begin) - 1);
  return std::max(table[w][begin], table[w][end - (size_t{1} << w)]);
}

int64_t CostModel::inputBytes(size_t layer) const {
  return layer == 0 ? problem_.input_bytes : problem_.layers[layer - 1].output_bytes;
}

int64_t CostModel::paramBytes(size_t begin, size_t end) const {
  return param_prefix_[end] - param_prefix_[begin];
}

int64_t CostModel::stateBytes(size_t begin, size_t end) const {
  return stateBytesOf(paramBytes(begin, end));
}

int64_t CostModel::stateBytesOf(int64_t w) const {
  if (!training()) return w;
  return 2 * w + static_cast<int64_t>(static_cast<double>(w) * options().optimizer_state_per_param);
}

bool CostModel::runs(int type, size_t begin, size_t end) const {
  const auto& p = lack_prefix_[static_cast<size_t>(type)];
  return p[end] == p[begin];
}

std::string CostModel::lacking(int type, size_t begin, size_t end) const {
  const DeviceCosts& d = deviceOf(type);
  for (size_t l = begin; l < end && !d.lacks.empty(); ++l)
    if (!d.lacks[l].empty())
      return "layer " + std::to_string(l) + " (" + problem_.layers[l].type + "): " + d.lacks[l];
  return "";
}

double CostModel::firstSaving(int type, size_t end) const {
  const auto& b = backward_prefix_[static_cast<size_t>(type)];
  const size_t p = first_param_;
  if (p == layers()) return 0;  // nothing to train: priced as its profile times it
  if (end <= p) return b[end];
  return b[p + 1] - first_backward_[static_cast<size_t>(type)];
}

double CostModel::compute(int type, size_t begin, size_t end, int tensor) const {
  if (!runs(type, begin, end)) return std::numeric_limits<double>::infinity();
  if (tensor > 1) {
    const TensorStage t = equalTensor(type, begin, end, tensor);
    if (!t.splits) return std::numeric_limits<double>::infinity();
    return t.compute(training());
  }
  const auto& p = time_prefix_[static_cast<size_t>(type)];
  return p[end] - p[begin] - (begin == 0 && training() ? firstSaving(type, end) : 0);
}

double CostModel::forward(int type, size_t begin, size_t end, int tensor) const {
  if (tensor > 1) return equalTensor(type, begin, end, tensor).forward;
  const auto& p = forward_prefix_[static_cast<size_t>(type)];
  return p[end] - p[begin];
}

double CostModel::backward(int type, size_t begin, size_t end, int tensor) const {
  if (tensor > 1) return equalTensor(type, begin, end, tensor).backward;
  const auto& p = backward_prefix_[static_cast<size_t>(type)];
  return p[end] - p[begin] - (begin == 0 ? firstSaving(type, end) : 0);
}

double CostModel::deferredWeightGradient(int type, size_t begin, size_t end, int tensor) const {
  if (tensor > 1) {
    const TensorStage t = equalTensor(type, begin, end, tensor);
    return t.weight - t.first_weight;
  }
  const size_t from = begin == 0 ? first_param_ + 1 : begin;
  return from < end ? weightGradient(type, from, end) : 0;
}

double CostModel::weightGradient(int type, size_t begin, size_t end, int tensor) const {
  if (tensor > 1) return equalTensor(type, begin, end, tensor).weight;
  const auto& p = weight_prefix_[static_cast<size_t>(type)];
  if (begin == 0 && first_param_ < end)  // the first one's backward is all weight gradient
    return p[end] - p[first_param_ + 1] + first_backward_[static_cast<size_t>(type)];
  return p[end] - p[begin];
}

const DeviceCosts& CostModel::deviceOf(int type) const {
  return problem_.devices[static_cast<size_t>(types_[static_cast<size_t>(type)].devices.front())];
}

double CostModel::nodeCores(int node) const {
  const auto& c = problem_.node_cores;
  return c.empty() ? 0 : c[static_cast<size_t>(node)];
}

MessageCpuCost CostModel::ownMessageCpu(int node) const {
  const auto& m = problem_.node_message_cpu;
  return m.empty() ? MessageCpuCost{} : m[static_cast<size_t>(node)];
}

double CostModel::messageCpu(int node, int from_node, int to_node, double bytes) const {
  const MessageCpuCost own = ownMessageCpu(node);
  const double link =
      from_node == to_node
          ? 0
          : problem_.links[static_cast<size_t>(from_node)][static_cast<size_t>(to_node)]
                .cpu_s_per_byte;
  return own.fixed_s + std::max(own.per_byte_s, link) * bytes;
}

double CostModel::messageCpuAtEnd(int node, int from_node, int to_node, double bytes) const {
  const MessageCpuCost own = ownMessageCpu(node);
  double link = 0;
  if (from_node != to_node) {
    const LinkCosts& l =
        problem_.links[static_cast<size_t>(from_node)][static_cast<size_t>(to_node)];
    link = (node == from_node ? l.sender_share : 1 - l.sender_share) * l.cpu_s_per_byte;
  }
  return 0.5 * own.fixed_s + std::max(0.5 * own.per_byte_s, link) * bytes;
}

double CostModel::sendTime(int node, double bytes) const { return ownMessageCpu(node).send(bytes); }

const LinkCosts& CostModel::linkCosts(int from, int to) const {
  const int a = types_[static_cast<size_t>(from)].node, b = types_[static_cast<size_t>(to)].node;
  return problem_.links[static_cast<size_t>(a)][static_cast<size_t>(b)];
}

double CostModel::allreduce(int type, size_t begin, size_t end, int replicas) const {
  if (replicas <= 1 || !training()) return 0;
  const int node = types_[static_cast<size_t>(type)].node;
  const LinkCosts& l = problem_.links[static_cast<size_t>(node)][static_cast<size_t>(node)];
  const double k = replicas;
  return 2 * (k - 1) / k * static_cast<double>(paramBytes(begin, end)) / l.bandwidth +
         2 * (k - 1) * l.latency_s;
}

std::vector<int> CostModel::typesOf(const std::vector<int>& devices) const {
  std::vector<int> types;
  for (const int d : devices) types.push_back(typeOf(d));
  return types;
}

std::vector<double> CostModel::replicaSizes(const std::vector<double>& shares) {
  double total = 0;
  for (const double s : shares) total += s;
  std::vector<double> sizes;
  for (const double s : shares)
    sizes.push_back(total > 0 ? static_cast<double>(shares.size()) * s / total : 1);
  return sizes;
}

CostModel::Pace CostModel::pace(const std::vector<int>& types, const std::vector<double>& shares,
                                size_t begin, size_t end) const {
  const auto k = static_cast<double>(types.size());
  const std::vector<double> sizes = replicaSizes(shares);
  Pace slowest;
  double longest = -1;
  for (size_t r = 0; r < types.size(); ++r) {
    const double size = sizes.empty() ? 1 : sizes[r];
    const double part = compute(types[r], begin, end) * size / k;
    if (part > longest) {
      longest = part;
      slowest = {static_cast<int>(r), size / k};
    }
  }
  return slowest;
}

double CostModel::allreduce(const std::vector<int>& types, size_t begin, size_t end) const {
  const size_t k = types.size();
  if (k <= 1 || !training()) return 0;
  const double bytes = 2.0 * static_cast<double>(k - 1) / static_cast<double>(k) *
                       static_cast<double>(paramBytes(begin, end));
  double bandwidth = 0, latency = 0, cpu_wall = 0;
  for (size_t r = 0; r < k; ++r) {
    const int node = types_[static_cast<size_t>(types[r])].node;
    const int next = types_[static_cast<size_t>(types[(r + 1) % k])].node;
    const LinkCosts& l = problem_.links[static_cast<size_t>(node)][static_cast<size_t>(next)];
    bandwidth = r == 0 ? l.bandwidth : std::min(bandwidth, l.bandwidth);
    latency = std::max(latency, l.latency_s);
    // What it sends on (and as much received), on one thread of its node's cores.
    const double cores = nodeCores(node);
    const double cpu = messageCpu(node, node, next, bytes);
    cpu_wall = std::max(cpu_wall, cores > 0 ? cpu / std::min(cores, 1.0) : cpu);
  }
  const double wire = bytes / bandwidth + 2 * static_cast<double>(k - 1) * latency;
  return std::max(wire, cpu_wall);
}

std::vector<double> CostModel::balancedShares(const std::vector<int>& types, size_t begin,
                                              size_t end) const {
  std::vector<double> shares;
  for (const int t : types) {
    const double c = compute(t, begin, end);
    shares.push_back(c > 0 && std::isfinite(c) ? 1 / c : 0);
  }
  double largest = *std::max_element(shares.begin(), shares.end());
  for (double& s : shares) s = largest > 0 ? s / largest : 1;  // the fastest's is 1
  return shares;
}

double CostModel::update(int type, size_t begin, size_t end, int tensor) const {
  if (!training()) return 0;
  if (tensor > 1) return equalTensor(type, begin, end, tensor).update;
  return static_cast<double>(paramBytes(begin, end)) * deviceOf(type).update_s_per_param_byte;
}

double CostModel::update(const std::vector<int>& types, size_t begin, size_t end) const {
  double slowest = 0;
  for (const int t : types) slowest = std::max(slowest, update(t, begin, end));
  return slowest;
}

double CostModel::stage(int type, size_t begin, size_t end, int replicas, int tensor) const {
  return compute(type, begin, end, tensor) / replicas +
         (allreduce(type, begin, end, replicas) + update(type, begin, end, tensor)) /
             static_cast<double>(options().microbatches);
}

double CostModel::linkTime(int64_t bytes, double ratio, int from_node, int to_node) const {
  const LinkCosts& l = problem_.links[static_cast<size_t>(from_node)][static_cast<size_t>(to_node)];
  return static_cast<double>(bytes) * ratio / l.bandwidth + l.latency_s;
}

double CostModel::link(size_t end, int from, int to) const {
  return link(end, from, to, options().activation_ratio, options().gradient_ratio);
}

double CostModel::link(size_t end, int from, int to, double activation_ratio,
                       double gradient_ratio) const {
  const int a = types_[static_cast<size_t>(from)].node, b = types_[static_cast<size_t>(to)].node;
  const int64_t bytes = problem_.layers[end - 1].output_bytes;
  double t = linkTime(bytes, activation_ratio, a, b);
  if (training()) t += linkTime(bytes, gradient_ratio, b, a);
  return t;
}

double CostModel::sourceLink(int to) const {
  const int src = options().source;
  if (src < 0 || typeOf(src) == to) return 0;
  return linkTime(problem_.input_bytes, options().activation_ratio,
                  problem_.devices[static_cast<size_t>(src)].node,
                  types_[static_cast<size_t>(to)].node);
}

int64_t CostModel::memory(size_t begin, size_t end, int stages_to_end, int replicas, int stages,
                          double scale, int tensor) const {
  if (tensor > 1) {
    // One rank's: as one device's, less the parts of the split layers' state it leaves to
    // the other ranks.
    const int64_t whole = memory(begin, end, stages_to_end, replicas, stages, scale);
    const auto split = static_cast<double>(equalTensor(0, begin, end, tensor).split_state);
    return whole - static_cast<int64_t>(split * (1 - 1.0 / tensor));
  }
  const CostOptions& o = options();
  const int64_t in = inputBytes(begin);
  const int64_t out = problem_.layers[end - 1].output_bytes;
  const int64_t directions = training() ? 2 : 1;
  int64_t transport = 0;
  if (begin > 0) transport += in;
  if (end < layers()) transport += out;
  transport *= o.transport_buffers * directions;
  int64_t state = stateBytes(begin, end);  // the weights alone when serving
  if (!training()) return state + rangeMax(working_max_, begin, end) + transport;
  if (o.zero > 0 && replicas > 1)  // each replica keeps its shard of the optimizer state
    state -= static_cast<int64_t>(static_cast<double>(paramBytes(begin, end)) *
                                  o.optimizer_state_per_param * (1 - 1.0 / replicas));
  const int64_t activations = stash_prefix_[end] - stash_prefix_[begin];
  const int64_t depth =
      o.schedule == ScheduleKind::kGPipe ? o.microbatches
      : o.schedule == ScheduleKind::kZeroBubbleH1
          ? std::min<int64_t>(o.microbatches, stages > 0 ? stages : o.microbatches)
          : std::min<int64_t>(o.microbatches, stages_to_end);
  const int64_t per_replica = (depth + replicas - 1) / replicas;
  // The microbatch whose backward runs holds, at layer l, the stash of the layers up to
  // l and l's input and output gradients; the others in flight their whole stash (with
  // recompute: their input).
  const int64_t backward = rangeMax(backward_max_, begin, end) - stash_prefix_[begin];
  const int64_t stash = static_cast<int64_t>(std::ceil(
      scale * static_cast<double>(o.recompute ? per_replica * in + backward
                                              : (per_replica - 1) * activations + backward)));
  return state + stash + transport;
}

}  // namespace tandem::partitioner

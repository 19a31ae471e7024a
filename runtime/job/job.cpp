#include "runtime/job/job.h"

#include <filesystem>
#include <optional>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file.h"
#include "core/train/microbatch.h"
#include "core/yaml_reader.h"

namespace tandem::runtime {

namespace {

std::string resolve(const std::string& base_dir, const std::string& path) {
  if (path.empty() || std::filesystem::path(path).is_absolute() || base_dir.empty()) return path;
  return (std::filesystem::path(base_dir) / path).lexically_normal().string();
}

// The optimizer map; `reference_batch` > 0 when it asks for the linear scaling rule
// (`lr_scale: linear`), applied once the job's batch is known.
void parseOptimizer(const YamlReader& r, const YAML::Node& node, OptimizerOptions& o,
                    int64_t& reference_batch) {
  if (!node.IsMap()) r.fail(node, "'optimizer' must be a map, e.g. {kind: sgd, lr: 0.01}");
  const YAML::Node* scale = nullptr;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (key == "kind") {
      o.kind = r.get<std::string>(v, key, "sgd or adamw");
    } else if (key == "lr") {
      o.lr = r.get<float>(v, key, "a number");
    } else if (key == "momentum") {
      o.momentum = r.get<float>(v, key, "a number");
    } else if (key == "nesterov") {
      o.nesterov = r.get<bool>(v, key, "true or false");
    } else if (key == "weight_decay") {
      o.weight_decay = r.get<float>(v, key, "a number");
    } else if (key == "beta1") {
      o.beta1 = r.get<float>(v, key, "a number");
    } else if (key == "beta2") {
      o.beta2 = r.get<float>(v, key, "a number");
    } else if (key == "eps") {
      o.eps = r.get<float>(v, key, "a number");
    } else if (key == "lr_schedule") {
      o.lr_schedule = r.get<std::string>(v, key, "constant, step or cosine");
    } else if (key == "warmup_steps") {
      o.warmup_steps = r.get<int64_t>(v, key, "a number of steps");
    } else if (key == "decay_steps") {
      o.decay_steps = r.get<int64_t>(v, key, "a number of steps");
    } else if (key == "decay_factor") {
      o.decay_factor = r.get<float>(v, key, "a number");
    } else if (key == "min_lr") {
      o.min_lr = r.get<float>(v, key, "a number");
    } else if (key == "lr_scale") {
      const std::string rule = r.get<std::string>(v, key, "linear or none");
      if (rule != "linear" && rule != "none") r.fail(v, "lr_scale must be linear or none");
      if (rule == "linear") scale = &v;
    } else if (key == "reference_batch") {
      reference_batch = r.positive(v, key);
    } else {
      r.fail(kv.first, "unknown optimizer key '" + key +
                           "' (expected kind, lr, momentum, nesterov, weight_decay, beta1, "
                           "beta2, eps, lr_schedule, warmup_steps, decay_steps, decay_factor, "
                           "min_lr, lr_scale or reference_batch)");
    }
  }
  if (scale && reference_batch <= 0)
    r.fail(*scale, "lr_scale: linear needs reference_batch: the batch lr was tuned at");
  if (!scale) reference_batch = 0;
  try {
    validate(o);
  } catch (const InvalidArgument& e) {
    r.fail(node, e.what());
  }
}

void parseCodec(const YamlReader& r, const YAML::Node& node, JobSpec& job) {
  if (!node.IsMap()) r.fail(node, "'codec' must be a map {activations: ..., gradients: ...}");
  const std::set<std::string> names = {"fp32", "fp16", "bf16", "int8", "auto"};
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const auto value = r.get<std::string>(kv.second, key, "fp32, fp16, bf16, int8 or auto");
    if (!names.count(value))
      r.fail(kv.second, "unknown codec '" + value + "' (expected fp32, fp16, bf16, int8 or auto)");
    if (value == "auto") job.codec_where = r.at(kv.second);
    const bool choose = value == "auto";
    const WireCodec codec = choose ? WireCodec::kRaw : parseWireCodec(value);
    if (key == "activations") {
      job.wire.activations = codec;
      job.activations_auto = choose;
      job.activation_codec_given = true;
    } else if (key == "gradients") {
      job.wire.gradients = codec;
      job.gradients_auto = choose;
      job.gradient_codec_given = true;
    } else {
      r.fail(kv.first, "unknown codec key '" + key + "' (expected activations or gradients)");
    }
  }
}

void parsePartition(const YamlReader& r, const YAML::Node& node, JobSpec& job,
                    const std::string& dir) {
  const char* expected =
      "'partition' must be 'equal', 'auto', a plan file (.yaml) or a list of layer ranges "
      "[begin, end]";
  job.partition_where = r.at(node);
  if (node.IsScalar()) {
    const std::string& v = node.Scalar();
    const auto ends = [&](const char* ext) {
      return v.size() > std::string(ext).size() && v.ends_with(ext);
    };
    if (v == "auto") {
      job.auto_partition = true;
    } else if (ends(".yaml") || ends(".yml")) {
      job.plan = resolve(dir, v);
    } else if (v != "equal") {
      r.fail(node, expected);
    }
    return;
  }
  if (!node.IsSequence() || node.size() == 0) r.fail(node, expected);
  for (const auto& entry : node) {
    // [begin, end], or {layers: [begin, end], replicas: N}. (Nodes are copied, never
    // assigned: assigning a YAML::Node overwrites the node it refers to.)
    int64_t replicas = 1, tensor = 1;
    std::vector<double> shares, tensor_shares;
    std::vector<std::string> tensor_devices;
    // A list of shares under `key`, one per replica (tensor rank).
    const auto sharesOf = [&](const YAML::Node& list, const std::string& key, const char* per,
                              std::vector<double>& out) {
      if (!list.IsSequence() || list.size() == 0)
        r.fail(list, "'" + key + "' is a list of numbers, one per " + per);
      for (const YAML::Node& s : list) {
        const auto v = r.get<double>(s, key, "a positive number");
        if (!(v > 0 && v <= 1e9))
          r.fail(s, std::string("a ") + per + "'s share must be in (0, 1e9]");
        out.push_back(v);
      }
    };
    const auto layersOf = [&](const YAML::Node& stage) {
      std::optional<YAML::Node> shares_node, tensor_node, tensor_shares_node;
      for (const auto& kv : stage) {
        const std::string key = r.get<std::string>(kv.first, "key", "a stage setting");
        if (key == "replicas") {
          replicas = r.positive(kv.second, key);
          if (replicas > 64) r.fail(kv.second, "'replicas' must be at most 64");
        } else if (key == "shares") {
          shares_node = kv.second;
          sharesOf(kv.second, key, "replica", shares);
        } else if (key == "tensor") {
          tensor_node = kv.second;
          if (kv.second.IsSequence()) {  // each rank's backend: [cpu, opencl:0]
            for (const YAML::Node& d : kv.second) {
              const auto name = r.get<std::string>(d, key, "a backend of the stage's node");
              if (name != "cpu" && name.rfind("opencl:", 0) != 0)
                r.fail(d, "tensor rank '" + name +
                              "' is not a backend of the stage's node "
                              "(cpu, opencl:N): ranks on other nodes are not supported yet");
              tensor_devices.push_back(name);
            }
            tensor = static_cast<int64_t>(tensor_devices.size());
            if (tensor == 0) r.fail(kv.second, "'tensor' lists no backend");
          } else {
            tensor = r.positive(kv.second, key);
          }
          if (tensor > kMaxTensorRanks) r.fail(kv.second, "'tensor' must be at most 64");
        } else if (key == "tensor_shares") {
          tensor_shares_node = kv.second;
          sharesOf(kv.second, key, "tensor rank", tensor_shares);
        } else if (key != "layers") {
          r.fail(kv.first, "unknown stage key '" + key +
                               "' (expected layers, replicas, shares, tensor or tensor_shares)");
        }
      }
      if (!stage["layers"]) r.fail(stage, "the stage has no 'layers: [begin, end]'");
      if (shares_node && shares.size() != static_cast<size_t>(replicas))
        r.fail(*shares_node, std::to_string(shares.size()) + " shares for the stage's " +
                                 std::to_string(replicas) + " replicas");
      if (tensor_shares_node && tensor_shares.size() != static_cast<size_t>(tensor))
        r.fail(*tensor_shares_node, std::to_string(tensor_shares.size()) +
                                        " tensor shares for the stage's " + std::to_string(tensor) +
                                        " tensor ranks");
      if (tensor > 1 && replicas > 1)
        r.fail(*tensor_node, "a tensor-split stage cannot have replicas yet");
      return stage["layers"];
    };
    const YAML::Node range = entry.IsMap() ? layersOf(entry) : YAML::Node(entry);
    if (!range.IsSequence() || range.size() != 2)
      r.fail(range, "a stage's layers are a range [begin, end]");
    const auto begin = r.get<long long>(range[0], "begin", "a layer index");
    const auto end = r.get<long long>(range[1], "end", "a layer index");
    if (begin < 0 || end <= begin)
      r.fail(range, "layer range [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") is empty or negative");
    job.ranges.push_back({{static_cast<size_t>(begin), static_cast<size_t>(end)},
                          static_cast<int>(replicas),
                          shares,
                          r.at(range),
                          static_cast<int>(tensor),
                          tensor_shares,
                          tensor_devices});
  }
}

// The job file's keys, for the message that refuses another.
constexpr const char* kJobKeys =
    "model, data, data_dir, train_limit, test_limit, epochs, batch, microbatches, schedule, "
    "chunks, recompute, seed, threads, optimizer, codec, transport, timeout_s, partition, "
    "stages, cluster, profile, max_replicas, max_tensor, rebalance_steps, zero, baseline, "
    "save, weights, "
    "checkpoint, max_restarts or rejoin_after_s";

// Where the settings that other settings constrain were given, if they were.
struct Given {
  std::optional<YAML::Node> partition, stages, max_replicas, max_tensor, microbatches, baseline,
      schedule, chunks;
};

// `max_replicas:`, `max_tensor:`: 1 to 64 (kMaxTensorRanks, the most of either a stage has).
int atMost64(const YamlReader& r, const YAML::Node& v, const std::string& key) {
  const int64_t n = r.positive(v, key);
  if (n > kMaxTensorRanks) r.fail(v, "'" + key + "' must be at most 64");
  return static_cast<int>(n);
}

// `rebalance_steps:`, 0 to kMaxRebalanceSteps.
int64_t rebalanceSteps(const YamlReader& r, const YAML::Node& v) {
  const int64_t steps = r.get<int64_t>(v, "rebalance_steps", "a whole number of steps, 0 or more");
  if (steps < 0 || steps > kMaxRebalanceSteps)
    r.fail(v, "'rebalance_steps' must be from 0 to " + std::to_string(kMaxRebalanceSteps));
  return steps;
}

// `zero:`, a replicated stage's ZeRO stage: 0, 1 or 2.
int zeroStage(const YamlReader& r, const YAML::Node& v) {
  const int64_t stage = r.get<int64_t>(v, "zero", "a ZeRO stage: 0, 1 or 2");
  if (stage == 3)
    r.fail(v,
           "'zero: 3' would gather a stage's parameters for every microbatch: a job's "
           "replicated stages shard 1 (the optimizer state) or 2 (and the summed gradients); "
           "`tandem train --replicas N --zero 3` shards the parameters of replicas of a whole "
           "model");
  if (stage < 0 || stage > 2) r.fail(v, "'zero' must be 0, 1 or 2, not " + std::to_string(stage));
  return static_cast<int>(stage);
}

// `baseline:`, a split placed for comparison.
std::string baselineName(const YamlReader& r, const YAML::Node& v) {
  const auto name = r.get<std::string>(v, "baseline", "a baseline's name");
  if (name != "equal-layers" && name != "equal-params" && name != "memory-proportional")
    r.fail(v, "unknown baseline '" + name +
                  "' (expected equal-layers, equal-params or memory-proportional)");
  return name;
}

// `schedule:` other than auto: a schedule that trains.
ScheduleKind parseTrainingSchedule(const YamlReader& r, const YAML::Node& v) {
  const auto name = r.get<std::string>(v, "schedule", "gpipe, 1f1b, zb-h1, interleaved or auto");
  ScheduleKind kind{};
  try {
    kind = parseSchedule(name);
  } catch (const InvalidArgument& e) {
    r.fail(v, e.what());
  }
  if (!isTraining(kind))
    r.fail(v, "schedule '" + name + "' cannot train (expected gpipe, 1f1b, zb-h1 or interleaved)");
  return kind;
}

// The checks of settings against each other, once every key is read.
void checkTogether(const YamlReader& r, const YAML::Node& root, const Given& given, JobSpec& job) {
  if (!given.partition)
    throw InvalidArgument(job.source + ": 'partition' is required ('equal' or ranges)");
  const bool planned = job.auto_partition || !job.plan.empty();
  if (planned && given.stages) r.fail(*given.stages, "'stages' comes from the plan; leave it out");
  if (given.baseline && !job.auto_partition)
    r.fail(*given.baseline,
           "'baseline' is for 'partition: auto' (it places that split over the same measured "
           "cluster instead of the search's)");
  if (given.max_replicas && !job.auto_partition)
    r.fail(*given.max_replicas,
           "'max_replicas' is for 'partition: auto'; give replicas in the "
           "partition ({layers: [b, e], replicas: N}) or the plan");
  if (given.max_tensor && !job.auto_partition)
    r.fail(*given.max_tensor,
           "'max_tensor' is for 'partition: auto'; give tensor ranks in the partition "
           "({layers: [b, e], tensor: N}) or the plan");
  if (!planned && job.ranges.empty() && job.stages == 0)
    r.fail(*given.partition, "'partition: equal' needs 'stages: N'");
  // Interleaved: each of the stages holds `chunks` of the model's ranges.
  const bool interleaved = job.train.schedule == ScheduleKind::kInterleaved1F1B;
  if (given.chunks && !interleaved)
    r.fail(*given.chunks, "'chunks' is for 'schedule: interleaved' (a stage's model chunks)");
  if (interleaved && !given.chunks) job.chunks = 2;
  if (interleaved)
    for (const JobSpec::Range& range : job.ranges)
      if (range.replicas > 1 || range.tensor > 1)
        throw InvalidArgument(range.where +
                              ": interleaved stages cannot have replicas or be "
                              "tensor-split");
  const auto per = static_cast<size_t>(job.chunks);
  if (!job.ranges.empty() && job.ranges.size() % per != 0)
    r.fail(*given.partition, "the partition lists " + std::to_string(job.ranges.size()) +
                                 " ranges, not a multiple of the " + std::to_string(per) +
                                 " chunks per stage");
  if (!job.ranges.empty() && given.stages &&
      static_cast<size_t>(job.stages) * per != job.ranges.size())
    r.fail(*given.stages, "'stages' is " + std::to_string(job.stages) +
                              " but the partition lists " + std::to_string(job.ranges.size()) +
                              " ranges" +
                              (per > 1 ? " (" + std::to_string(per) + " chunks per stage)" : ""));
  if (!job.ranges.empty()) job.stages = static_cast<int>(job.ranges.size() / per);
  if (interleaved && !planned && job.stages < 2)
    r.fail(given.stages ? *given.stages : *given.partition,
           "interleaved stages need 2 stages or more");
  if (job.microbatches_auto && !job.auto_partition)
    r.fail(*given.microbatches,
           "'microbatches: auto' is for 'partition: auto' (the partitioner chooses)");
  if (job.schedule_auto && !job.auto_partition)
    r.fail(*given.schedule, "'schedule: auto' is for 'partition: auto' (the partitioner chooses)");
  if (!job.codec_where.empty() && !job.auto_partition && job.plan.empty())
    throw InvalidArgument(job.codec_where +
                          ": a codec of 'auto' is each link's in a plan: it needs 'partition: "
                          "auto' (the partitioner chooses them) or 'partition: PLAN.yaml'");
  if (job.microbatches_auto)
    job.train.microbatches = std::min<int64_t>(job.train.microbatches, job.train.batch);
  // A microbatch holds a sample at least; a batch that does not divide evenly is cut into
  // microbatches whose sizes differ by one.
  if (job.train.microbatches > job.train.batch)
    r.fail(given.microbatches ? *given.microbatches : root,
           "'microbatches' is " + std::to_string(job.train.microbatches) + " but a batch of " +
               std::to_string(job.train.batch) + " samples makes at most " +
               std::to_string(job.train.batch) + " microbatches");
}

}  // namespace

void parseCheckpoint(const YamlReader& r, const YAML::Node& node, const std::string& dir,
                     JobSpec::Checkpoint& c) {
  if (!node.IsMap()) r.fail(node, "'checkpoint' must be a map, e.g. {every_steps: 100, keep: 2}");
  c.where = r.at(node);
  c.every_steps = kDefaultCheckpointSteps;
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (key == "every_steps") {
      c.every_steps = r.positive(v, key);
    } else if (key == "keep") {
      c.keep = static_cast<int>(r.positive(v, key));
      if (c.keep > 1000) r.fail(v, "'keep' must be at most 1000");
    } else if (key == "dir") {
      c.dir = resolve(dir, r.get<std::string>(v, key, "a directory"));
    } else {
      r.fail(kv.first, "unknown checkpoint key '" + key + "' (expected every_steps, keep or dir)");
    }
  }
}

JobSpec parseJobSpec(const std::string& yaml_text, const std::string& source) {
  const YamlReader r(source);
  const YAML::Node root = r.load(yaml_text);
  if (!root.IsMap()) throw InvalidArgument(source + ": a job file is a map of settings");
  JobSpec job;
  job.source = source;
  const std::string dir = std::filesystem::path(source).parent_path().string();
  Given given;
  int64_t reference_batch = 0;  // > 0: the optimizer's lr_scale: linear
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (key == "model") {
      job.model = resolve(dir, r.get<std::string>(v, key, "a path"));
    } else if (key == "data") {
      job.data.name = r.get<std::string>(v, key, "a dataset name");
      if (job.data.name != "fashion-mnist" &&
          (job.data.name.rfind("text:", 0) != 0 || job.data.name.size() < 6))
        r.fail(v, "unknown dataset '" + job.data.name +
                      "' (expected fashion-mnist or text:PATH, a file or folder of text on the "
                      "first stage's node)");
    } else if (key == "data_dir") {
      job.data.dir = r.get<std::string>(v, key, "a directory");
    } else if (key == "train_limit") {
      job.data.train_limit = r.positive(v, key);
    } else if (key == "test_limit") {
      job.data.test_limit = r.positive(v, key);
    } else if (key == "epochs") {
      job.train.epochs = r.positive(v, key);
    } else if (key == "batch") {
      job.train.batch = r.positive(v, key);
    } else if (key == "microbatches") {
      given.microbatches = v;
      if (v.IsScalar() && v.Scalar() == "auto")
        job.microbatches_auto = true;
      else
        job.train.microbatches = r.positive(v, key);
    } else if (key == "schedule" && v.IsScalar() && v.Scalar() == "auto") {
      job.schedule_auto = true;
      given.schedule = v;
    } else if (key == "schedule") {
      job.train.schedule = parseTrainingSchedule(r, v);
      given.schedule = v;
    } else if (key == "chunks") {
      given.chunks = v;
      job.chunks = static_cast<int>(r.positive(v, key));
      if (job.chunks < 2 || job.chunks > 64) r.fail(v, "'chunks' must be from 2 to 64");
    } else if (key == "recompute") {
      job.train.recompute = r.get<bool>(v, key, "true or false");
    } else if (key == "seed") {
      job.train.seed = r.get<unsigned long long>(v, key, "a non-negative integer");
    } else if (key == "threads") {
      job.threads = static_cast<int>(r.positive(v, key));
    } else if (key == "optimizer") {
      parseOptimizer(r, v, job.train.optimizer, reference_batch);
    } else if (key == "codec") {
      parseCodec(r, v, job);
    } else if (key == "transport") {
      job.transport = r.get<std::string>(v, key, "tcp or ipc");
      job.transport_where = r.at(v);
      if (job.transport != "tcp" && job.transport != "ipc")
        r.fail(v, "unknown transport '" + job.transport + "' (expected tcp or ipc)");
    } else if (key == "timeout_s") {
      job.wire.timeout_s = r.positive(v, key);
    } else if (key == "rebalance_steps") {
      job.train.rebalance_steps = rebalanceSteps(r, v);
    } else if (key == "zero") {
      job.train.zero = zeroStage(r, v);
      job.zero_where = r.at(v);
    } else if (key == "max_tensor") {
      job.max_tensor = atMost64(r, v, key);
      given.max_tensor = v;
    } else if (key == "max_replicas") {
      job.max_replicas = atMost64(r, v, key);
      given.max_replicas = v;
    } else if (key == "baseline") {
      job.baseline = baselineName(r, v);
      given.baseline = v;
    } else if (key == "partition") {
      given.partition = v;
      parsePartition(r, v, job, dir);
    } else if (key == "stages") {
      given.stages = v;
      job.stages = static_cast<int>(r.positive(v, key));
    } else if (key == "cluster") {
      job.cluster = resolve(dir, r.get<std::string>(v, key, "a path"));
    } else if (key == "profile") {
      job.profile = resolve(dir, r.get<std::string>(v, key, "a path"));
    } else if (key == "save") {
      job.save = resolve(dir, r.get<std::string>(v, key, "a path"));
    } else if (key == "weights") {
      job.weights = resolve(dir, r.get<std::string>(v, key, "a path"));
    } else if (key == "checkpoint") {
      parseCheckpoint(r, v, dir, job.checkpoint);
    } else if (key == "max_restarts") {
      const auto n = r.get<long long>(v, key, "a whole number");
      if (n < 0 || n > 1000) r.fail(v, "'max_restarts' must be from 0 to 1000");
      job.max_restarts = static_cast<int>(n);
    } else if (key == "rejoin_after_s") {
      const auto s = r.get<double>(v, key, "a number of seconds");
      if (!(s >= 0 && s <= 86400)) r.fail(v, "'rejoin_after_s' must be from 0 to 86400 seconds");
      job.rejoin_after_s = s;
    } else {
      r.fail(kv.first, "unknown key '" + key + "' (expected " + kJobKeys + ")");
    }
  }
  if (job.model.empty()) throw InvalidArgument(source + ": 'model' is required");
  if (reference_batch > 0) {  // the linear scaling rule: the rate for this global batch
    job.train.optimizer.lr =
        linearlyScaledLr(job.train.optimizer.lr, job.train.batch, reference_batch);
    job.train.optimizer.min_lr =
        linearlyScaledLr(job.train.optimizer.min_lr, job.train.batch, reference_batch);
  }
  if (job.checkpoint.every_steps > 0 && job.checkpoint.dir.empty())
    job.checkpoint.dir =
        resolve(dir, "checkpoints/" + std::filesystem::path(source).stem().string());
  checkTogether(r, root, given, job);
  return job;
}

JobSpec loadJobSpec(const std::string& path) {
  return parseJobSpec(readFile(path, "job file"), path);
}

std::vector<LayerRange> equalStageRanges(size_t layers, int stages) {
  TANDEM_CHECK_MSG(stages >= 1 && static_cast<size_t>(stages) <= layers, InvalidArgument,
                   stages << " stages for " << layers << " layers (each stage needs at least one)");
  // The same cut as a batch into microbatches: sizes differ by at most one, larger first.
  std::vector<LayerRange> out;
  for (const MicrobatchSlice& part :
       splitBatch(static_cast<int64_t>(layers), static_cast<int64_t>(stages)))
    out.push_back(
        {static_cast<size_t>(part.offset), static_cast<size_t>(part.offset + part.count)});
  return out;
}

std::vector<LayerRange> stageRanges(const JobSpec& job, const Model& model) {
  const size_t layers = model.size();
  if (job.ranges.empty()) {
    const int parts = job.stages * job.chunks;
    TANDEM_CHECK_MSG(job.stages >= 1 && static_cast<size_t>(parts) <= layers, InvalidArgument,
                     job.source << ": " << job.stages << " stages"
                                << (job.chunks > 1 ? " of " + std::to_string(job.chunks) + " chunks"
                                                   : std::string())
                                << " for a model of " << layers << " layers (each "
                                << (job.chunks > 1 ? "chunk" : "stage") << " needs at least one)");
    return equalStageRanges(layers, parts);
  }
  size_t expect = 0;
  for (size_t s = 0; s < job.ranges.size(); ++s) {
    const auto [begin, end] = job.ranges[s].layers;
    const std::string& where = job.ranges[s].where;
    std::ostringstream range;
    range << "stage " << s << "'s layers [" << begin << ", " << end << ")";
    TANDEM_CHECK_MSG(
        begin >= expect, InvalidArgument,
        where << ": " << range.str() << " overlap the previous stage's, which end at " << expect);
    TANDEM_CHECK_MSG(begin == expect, InvalidArgument,
                     where << ": " << range.str() << " leave layers [" << expect << ", " << begin
                           << ") on no stage");
    TANDEM_CHECK_MSG(
        end <= layers, InvalidArgument,
        where << ": " << range.str() << " go past the model's " << layers << " layers");
    expect = end;
  }
  TANDEM_CHECK_MSG(expect == layers, InvalidArgument,
                   job.ranges.back().where << ": the stages end at layer " << expect
                                           << " but the model has " << layers
                                           << " layers: the rest are on no stage");
  std::vector<LayerRange> out;
  for (const JobSpec::Range& range : job.ranges) out.push_back(range.layers);
  return out;
}

}  // namespace tandem::runtime

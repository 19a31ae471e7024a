// tandem train: training of a model spec on a dataset, on one device, data parallel over
// several (core/train/data_parallel.h) or tensor parallel over several
// (core/train/tensor_parallel.h), the ranks on the in-process group.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "backends/registry.h"
#include "core/error.h"
#include "core/file.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "core/train/data_parallel.h"
#include "core/train/tensor_parallel.h"
#include "core/train/trainer.h"
#include "runtime/job/model_source.h"
#include "targets/tandem/commands.h"
#include "targets/tandem/progress.h"
#include "transport/local_group.h"

namespace tandem::cli {

namespace {

struct TrainArgs {
  std::string model, data = "fashion-mnist", data_dir, save, device = "cpu";
  int64_t epochs = 1, batch = 64, train_limit = 0, test_limit = 0;
  int threads = 1;
  uint64_t seed = 1;
  OptimizerOptions opt;
  int64_t reference_batch = 0;  // --lr-scale-from: the linear scaling rule's batch
  bool no_progress = false;
  // Data parallel: replicas, their devices (one, or one per replica) and batch shares.
  int replicas = 1;
  int zero = 0;                      // ZeRO stage of the replicas' optimizer state
  std::vector<double> state_shares;  // each replica's room for its shard (empty: equal)
  std::vector<std::string> devices;
  std::vector<double> shares;
  std::string profile;  // shares from this profile's device speeds instead
  double bucket_mib = 1;
  // Tensor parallel: ranks sharing each split layer's features (--devices, --shares and
  // --profile then name the ranks' devices and their feature shares).
  int tensor = 1;
};

// Each replica's (or tensor rank's) device, from --device, --devices and --replicas or
// --tensor (checked against each other and against --shares, --profile and --bucket-mib).
std::vector<std::string> replicaDevices(const TrainArgs& a) {
  TANDEM_CHECK_MSG(a.tensor == 1 || a.replicas == 1, InvalidArgument,
                   "--tensor " << a.tensor << " with --replicas " << a.replicas
                               << ": one node trains on one parallel axis at a time");
  TANDEM_CHECK_MSG(a.zero == 0 || a.replicas > 1, InvalidArgument,
                   "--zero " << a.zero
                             << " shards the training state over data-parallel replicas: give "
                                "--replicas 2 or more");
  TANDEM_CHECK_MSG(a.state_shares.empty() || a.zero > 0, InvalidArgument,
                   "--state-shares sizes the replicas' shards of the training state: give "
                   "--zero 1, 2 or 3 too");
  TANDEM_CHECK_MSG(a.state_shares.empty() || static_cast<int>(a.state_shares.size()) == a.replicas,
                   InvalidArgument,
                   "--state-shares gives " << a.state_shares.size() << " shares for " << a.replicas
                                           << " replicas");
  const bool tensor = a.tensor > 1;
  const std::string axis = tensor ? "--tensor" : "--replicas";
  const std::string rank = tensor ? "tensor rank" : "replica";
  const int wanted = tensor ? a.tensor : a.replicas;
  std::vector<std::string> devices =
      a.devices.empty() ? std::vector<std::string>{a.device} : a.devices;
  // --devices alone sets the rank count; with --replicas or --tensor it must agree (or be one).
  TANDEM_CHECK_MSG(devices.size() == 1 || wanted == 1 || static_cast<int>(devices.size()) == wanted,
                   InvalidArgument,
                   "--devices names " << devices.size() << " devices for " << axis << " " << wanted
                                      << " (give one, or one per " << rank << ")");
  const int ranks = std::max<int>(wanted, static_cast<int>(devices.size()));
  TANDEM_CHECK_MSG(
      a.shares.empty() || static_cast<int>(a.shares.size()) == ranks, InvalidArgument,
      "--shares gives " << a.shares.size() << " shares for " << ranks << " " << rank << "s");
  TANDEM_CHECK_MSG(a.profile.empty() || a.shares.empty(), InvalidArgument,
                   "give --shares or --profile, not both");
  TANDEM_CHECK_MSG(
      a.profile.empty() || ranks > 1, InvalidArgument,
      "--profile sizes the " << rank << "s' shares: give " << axis << " or --devices too");
  TANDEM_CHECK_MSG(ranks == 1 || a.bucket_mib <= 1 << 20, InvalidArgument,
                   "--bucket-mib " << a.bucket_mib << " is above 1048576 (1 TiB)");
  devices.resize(static_cast<size_t>(ranks), devices.back());
  return devices;
}

// The trainer of each mode behind one face: one device, data-parallel replicas, or tensor
// ranks; the backends outlive it.
struct Training {
  // What the starting weights' model file said of itself (a Hugging Face import's
  // tokenizer and end-of-text ids, an ONNX model's output activation), saved on with the
  // trained model.
  std::map<std::string, AttrValue> carried;
  std::unique_ptr<Model> single;
  std::unique_ptr<Optimizer> single_opt;
  std::unique_ptr<Trainer> trainer;
  std::vector<std::unique_ptr<Group>> groups;
  std::unique_ptr<DataParallelTrainer> parallel;
  std::unique_ptr<TensorParallelTrainer> tensor;

  Model& model() { return single ? *single : parallel ? parallel->model(0) : tensor->model(0); }
  EpochReport epoch(const Dataset& data, int64_t e,
                    const std::function<void(const StepReport&)>& report) {
    if (single) return trainer->trainEpoch(data, e, report);
    return parallel ? parallel->trainEpoch(data, e, report) : tensor->trainEpoch(data, e, report);
  }
  EvalResult evaluate(const Dataset& data, int64_t batch) {
    return tensor ? tensor->evaluate(data, batch) : tandem::evaluate(model(), data, batch);
  }
  void save(const std::string& path, std::map<std::string, AttrValue> meta) {
    meta.insert(carried.begin(), carried.end());  // (the training's own keys win)
    if (!tensor) {
      // (replicas: every shard's state merged; replica 0's own when not sharded)
      const std::unique_ptr<Optimizer> merged = parallel ? parallel->mergedOptimizer() : nullptr;
      saveModel(path, model(), single ? single_opt.get() : merged.get(), meta);
      return;
    }
    // The whole model assembled from the ranks' slices, on the host.
    auto host = makeBackend("cpu");
    const TensorParts merged = tensor->merged(*host);
    saveModel(path, *merged.model, merged.optimizer.get(), meta);
  }
};

Training makeTraining(const TrainArgs& a, const ModelSpec& spec,
                      const std::shared_ptr<const std::vector<uint8_t>>& weights,
                      const std::vector<std::unique_ptr<Backend>>& backends,
                      const std::vector<double>& shares) {
  Training t;
  const auto ranks = static_cast<int>(backends.size());
  if (ranks == 1) {
    t.single = std::make_unique<Model>(spec);
    t.single->build(*backends[0], a.seed);
    if (weights) {  // a model file's or ONNX model's: training continues from them
      const ModelFile from = parseModelFile(*weights, a.model);
      loadWeights(*t.single, from, true);
      t.carried = from.metadata;
    }
    t.single_opt = std::make_unique<Optimizer>(*backends[0], a.opt);
    t.trainer =
        std::make_unique<Trainer>(*t.single, *t.single_opt, TrainOptions{a.batch, a.seed, true});
    return t;
  }
  t.groups = transport::makeLocalGroup(ranks);
  std::vector<Backend*> be;
  std::vector<Group*> g;
  for (int r = 0; r < ranks; ++r) {
    be.push_back(backends[static_cast<size_t>(r)].get());
    g.push_back(t.groups[static_cast<size_t>(r)].get());
  }
  if (a.tensor > 1) {
    t.tensor = std::make_unique<TensorParallelTrainer>(spec, be, g, shares, a.opt,
                                                       TrainOptions{a.batch, a.seed, true});
    spdlog::info("tensor split over {} ranks (feature shares {:.3g}): {}", ranks,
                 fmt::join(t.tensor->shares(), " : "),
                 describe(Sequence(spec.layers), t.tensor->roles()));
    if (weights) {  // each rank continues from its slices of them
      auto host = makeBackend("cpu");
      Model whole(spec);
      whole.build(*host, a.seed);
      const ModelFile from = parseModelFile(*weights, a.model);
      loadWeights(whole, from, true);
      t.carried = from.metadata;
      t.tensor->startFrom(whole);
    }
    return t;
  }
  DataParallelOptions o;
  o.batch = a.batch;
  o.seed = a.seed;
  o.shares = shares;
  o.bucket_bytes = static_cast<size_t>(std::max(a.bucket_mib, 1e-6) * (1 << 20));
  o.zero = a.zero;
  o.state_shares = a.state_shares;
  t.parallel = std::make_unique<DataParallelTrainer>(spec, be, g, a.opt, o);
  return t;
}

void runTrain(TrainArgs a) {
  validate(a.opt);
  if (a.reference_batch > 0) {  // the linear scaling rule: the rate for this batch
    a.opt.lr = linearlyScaledLr(a.opt.lr, a.batch, a.reference_batch);
    a.opt.min_lr = linearlyScaledLr(a.opt.min_lr, a.batch, a.reference_batch);
    spdlog::info("learning rate {} (linear scaling: batch {} over {})", a.opt.lr, a.batch,
                 a.reference_batch);
  }
  TANDEM_CHECK_MSG(a.epochs > 0, InvalidArgument, "--epochs must be positive, got " << a.epochs);
  TANDEM_CHECK_MSG(a.batch > 0, InvalidArgument, "--batch must be positive, got " << a.batch);
  if (!a.save.empty()) checkWritable(a.save, "model file");
  const std::vector<std::string> devices = replicaDevices(a);
  const int ranks = static_cast<int>(devices.size());
  // The backends outlive everything that holds their memory (declared first).
  std::vector<std::unique_ptr<Backend>> backends;
  for (const std::string& d : devices)
    backends.push_back(makeBackend(d, BackendOptions{a.threads}));
  const runtime::ModelSource source = runtime::readModelSource(a.model);
  const ModelSpec& spec = source.spec;
  TANDEM_CHECK_MSG(!source.weights || ranks == 1 || a.tensor > 1, InvalidArgument,
                   a.model << ": starting data-parallel replicas from the weights a model file "
                              "or ONNX model brings is not supported yet: train it on one "
                              "device, or run it as a job");
  const Model unbuilt(spec);  // shapes and counts of the whole model (a tensor rank's are less)
  std::vector<double> shares = a.shares;
  if (!a.profile.empty()) {
    shares = sharesFromProfile(parseProfile(readFile(a.profile, "profile"), a.profile), unbuilt,
                               devices, a.profile);
    double total = 0;
    for (double s : shares) total += s;
    std::string split;
    for (size_t r = 0; r < shares.size(); ++r)
      split += fmt::format("{}{} {:.1f}% ({:.0f} samples/s)", r ? ", " : "", devices[r],
                           100 * shares[r] / total, shares[r]);
    spdlog::info("{} shares from {}: {}", a.tensor > 1 ? "feature" : "batch", a.profile, split);
  }
  const Shape input = unbuilt.inputShape();  // text data: windows of the context [T]
  const int64_t context = input.rank() == 1 ? input[0] : 0;
  Training t = makeTraining(a, spec, source.weights, backends, shares);
  // Text data as the model's tokenizer makes tokens of it (a Hugging Face folder's, or
  // the one a model file keeps: what the starting weights carried), else its bytes.
  ModelFile carried;
  carried.metadata = t.carried;
  const TextTokens tokens = runtime::textTokensOf(carried, unbuilt, a.data, a.model);
  const Dataset train =
      loadDataset(a.data, a.data_dir, true, a.train_limit, context, a.seed, {}, tokens);
  const Dataset test =
      loadDataset(a.data, a.data_dir, false, a.test_limit, context, a.seed, {}, tokens);
  std::string where;
  for (const std::string& d : devices) where += (where.empty() ? "" : ", ") + d;
  const std::string axis =
      ranks == 1
          ? std::string()
          : fmt::format(", {} over {} {}", a.tensor > 1 ? "tensor parallel" : "data parallel",
                        ranks, a.tensor > 1 ? "ranks" : "replicas");
  spdlog::info(
      "training '{}' ({} parameters{}) on {} with {} thread(s) each: {} train / {} test "
      "samples{}",
      t.model().name(), unbuilt.paramCount(), a.tensor > 1 ? " in all" : "", where, a.threads,
      train.size(), test.size(), axis);
  Progress progress(a.epochs);
  EvalResult last;
  for (int64_t e = 0; e < a.epochs; ++e) {
    const auto report = a.no_progress ? std::function<void(const StepReport&)>()
                                      : [&](const StepReport& s) { progress.update(s); };
    const EpochReport r = t.epoch(train, e, report);
    progress.finishEpoch();
    last = t.evaluate(test, a.batch);  // the training batch bounds memory
    std::printf(
        "epoch %lld/%lld: train loss %.4f, test loss %.4f, test accuracy %.4f%s, "
        "%.2f s (%.0f samples/s)\n",
        static_cast<long long>(e + 1), static_cast<long long>(a.epochs), r.train_loss, last.loss,
        last.accuracy,
        test.tokens ? fmt::format(", test perplexity {:.2f}", std::exp(last.loss)).c_str() : "",
        r.seconds, r.samples_per_s);
    std::fflush(stdout);
  }
  if (t.parallel) {  // where the training state lives (ZeRO 1 and 2: a shard on each)
    std::string state, grads, params;
    for (size_t r = 0; r < t.parallel->replicas(); ++r) {
      const char* comma = r ? ", " : "";
      state += fmt::format("{}{:.2f}", comma, t.parallel->stateBytes(r) / 1048576.0);
      grads += fmt::format("{}{:.2f} ({:.2f})", comma, t.parallel->gradientBytes(r) / 1048576.0,
                           t.parallel->peakGradientBytes(r) / 1048576.0);
      params += fmt::format("{}{:.2f} ({:.2f})", comma, t.parallel->parameterBytes(r) / 1048576.0,
                            t.parallel->peakParameterBytes(r) / 1048576.0);
    }
    std::printf("optimizer state per replica (ZeRO %d): %s MiB\n", a.zero, state.c_str());
    std::printf("gradients per replica between steps (most at once): %s MiB\n", grads.c_str());
    std::printf("parameters per replica between steps (most at once): %s MiB\n", params.c_str());
  }
  std::printf("test accuracy: %.4f\n", last.accuracy);
  std::fflush(stdout);
  if (!a.save.empty()) {
    t.save(a.save, {{"seed", static_cast<int64_t>(a.seed)},
                    {"epochs", a.epochs},
                    {"dataset", a.data},
                    {"test_accuracy", last.accuracy}});
    spdlog::info("saved {}", a.save);
  }
}

}  // namespace

void addTrain(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* c = app.add_subcommand(
      "train",
      "Train a model on one device, data parallel on several (--replicas), or with its linear "
      "and convolution pairs split over several (--tensor)");
  c->add_option("--model", args->model,
                "Model spec (YAML), or an ONNX model (.onnx) or Hugging Face folder starting "
                "from its weights")
      ->required()
      ->check(CLI::ExistingPath);
  c->add_option("--data", args->data,
                "fashion-mnist, or text:PATH (a file or folder of text: byte tokens, windows "
                "of the model's context; the last 10% held out)")
      ->check(datasetName());
  c->add_option("--data-dir", args->data_dir, "Directory holding the dataset files");
  c->add_option("--epochs", args->epochs, "Passes over the training set");
  c->add_option("--batch", args->batch, "Samples per step");
  c->add_option("--optimizer", args->opt.kind, "sgd or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  c->add_option("--lr", args->opt.lr, "Learning rate");
  c->add_option("--momentum", args->opt.momentum, "SGD momentum");
  c->add_flag("--nesterov", args->opt.nesterov, "SGD with Nesterov momentum");
  c->add_option("--weight-decay", args->opt.weight_decay, "L2 (sgd) or decoupled (adamw) decay");
  c->add_option("--lr-schedule", args->opt.lr_schedule,
                "After the warm-up: constant, step (x --decay-factor every --decay-steps) or "
                "cosine (to --min-lr over --decay-steps)")
      ->check(CLI::IsMember({"constant", "step", "cosine"}));
  c->add_option("--warmup-steps", args->opt.warmup_steps,
                "Steps whose rate rises linearly to --lr");
  c->add_option("--decay-steps", args->opt.decay_steps, "Steps of the step or cosine decay");
  c->add_option("--decay-factor", args->opt.decay_factor, "Step decay's factor");
  c->add_option("--min-lr", args->opt.min_lr, "Cosine decay's floor");
  c->add_option("--lr-scale-from", args->reference_batch,
                "Linear scaling rule: --lr was tuned at this batch; the rate used is "
                "lr x batch / this")
      ->check(CLI::PositiveNumber);
  c->add_option("--threads", args->threads, "CPU threads")->check(CLI::Range(1, 1024));
  c->add_option("--seed", args->seed, "Seed for initialisation, shuffling and dropout");
  c->add_option("--device", args->device, "Device to train on");
  c->add_option("--replicas", args->replicas,
                "Data-parallel replicas (threads sharing memory), each on --device or on its "
                "entry of --devices")
      ->check(CLI::Range(1, 64));
  c->add_option("--zero", args->zero,
                "ZeRO stage of the replicas' training state: 0 (each keeps all), 1 (a shard of "
                "the optimizer state on each, whose rows it steps and broadcasts) or 2 (and "
                "of the summed gradients) or 3 (and of the parameters, each layer's gathered "
                "before its forward and its backward)")
      ->check(CLI::Range(0, 3));
  c->add_option("--state-shares", args->state_shares,
                "Comma-separated relative room per replica for its shard of the training state "
                "(e.g. each device's memory; default: equal), with --zero")
      ->delimiter(',');
  c->add_option("--tensor", args->tensor,
                "Tensor-parallel ranks (threads sharing memory), each on --device or on its "
                "entry of --devices, each holding its share of every linear pair's features "
                "and convolution pair's channels")
      ->check(CLI::Range(1, 64));
  c->add_option("--devices", args->devices,
                "Comma-separated devices, one per replica (or tensor rank)")
      ->delimiter(',');
  c->add_option("--shares", args->shares,
                "Comma-separated relative shares per replica (of the batch) or tensor rank (of "
                "the features) (default: equal)")
      ->delimiter(',');
  c->add_option(
       "--profile", args->profile,
       "Shares in proportion to each replica's (tensor rank's) device speed in this profile "
       "(tandem profile --model M --devices ...)")
      ->check(CLI::ExistingFile);
  c->add_option("--bucket-mib", args->bucket_mib, "Gradient MiB per allreduce bucket")
      ->check(positiveNumber());
  c->add_option("--save", args->save, "Write the trained model (with optimizer state) here");
  c->add_option("--train-limit", args->train_limit, "Use only the first N training samples");
  c->add_option("--test-limit", args->test_limit, "Use only the first N test samples");
  c->add_flag("--no-progress", args->no_progress, "Do not report progress on stderr");
  c->callback([args] { runTrain(*args); });
}

}  // namespace tandem::cli

// tandem train: training of a model spec on a dataset, on one device or data parallel
// over several (core/train/data_parallel.h, the in-process group).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "backends/registry.h"
#include "core/error.h"
#include "core/file.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "core/train/data_parallel.h"
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
  std::vector<std::string> devices;
  std::vector<double> shares;
  std::string profile;  // shares from this profile's device speeds instead
  double bucket_mib = 1;
};

// Each replica's device, from --device, --devices and --replicas (checked against each
// other and against --shares, --profile and --bucket-mib).
std::vector<std::string> replicaDevices(const TrainArgs& a) {
  std::vector<std::string> devices =
      a.devices.empty() ? std::vector<std::string>{a.device} : a.devices;
  // --devices alone sets the replica count; with --replicas it must agree (or be one).
  TANDEM_CHECK_MSG(
      devices.size() == 1 || a.replicas == 1 || static_cast<int>(devices.size()) == a.replicas,
      InvalidArgument,
      "--devices names " << devices.size() << " devices for --replicas " << a.replicas
                         << " (give one, or one per replica)");
  const int replicas = std::max<int>(a.replicas, static_cast<int>(devices.size()));
  TANDEM_CHECK_MSG(
      a.shares.empty() || static_cast<int>(a.shares.size()) == replicas, InvalidArgument,
      "--shares gives " << a.shares.size() << " shares for " << replicas << " replicas");
  TANDEM_CHECK_MSG(a.profile.empty() || a.shares.empty(), InvalidArgument,
                   "give --shares or --profile, not both");
  TANDEM_CHECK_MSG(a.profile.empty() || replicas > 1, InvalidArgument,
                   "--profile sizes the replicas' shares: give --replicas or --devices too");
  TANDEM_CHECK_MSG(replicas == 1 || a.bucket_mib <= 1 << 20, InvalidArgument,
                   "--bucket-mib " << a.bucket_mib << " is above 1048576 (1 TiB)");
  devices.resize(static_cast<size_t>(replicas), devices.back());
  return devices;
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
  const int replicas = static_cast<int>(devices.size());
  // The backends outlive everything that holds their memory (declared first).
  std::vector<std::unique_ptr<Backend>> backends;
  for (const std::string& d : devices)
    backends.push_back(makeBackend(d, BackendOptions{a.threads}));
  const runtime::ModelSource source = runtime::readModelSource(a.model);
  const ModelSpec& spec = source.spec;
  TANDEM_CHECK_MSG(!source.weights || replicas == 1, InvalidArgument,
                   a.model << ": starting data-parallel replicas from the weights a model file "
                              "or ONNX model brings is not supported yet: train it with one "
                              "replica, or run it as a job");
  std::vector<double> shares = a.shares;
  if (!a.profile.empty()) {
    shares = sharesFromProfile(parseProfile(readFile(a.profile, "profile"), a.profile), Model(spec),
                               devices, a.profile);
    double total = 0;
    for (double s : shares) total += s;
    std::string split;
    for (size_t r = 0; r < shares.size(); ++r)
      split += fmt::format("{}{} {:.1f}% ({:.0f} samples/s)", r ? ", " : "", devices[r],
                           100 * shares[r] / total, shares[r]);
    spdlog::info("batch shares from {}: {}", a.profile, split);
  }
  const Shape input = Model(spec).inputShape();  // text data: windows of the context [T]
  const int64_t context = input.rank() == 1 ? input[0] : 0;
  const Dataset train = loadDataset(a.data, a.data_dir, true, a.train_limit, context, a.seed);
  const Dataset test = loadDataset(a.data, a.data_dir, false, a.test_limit, context, a.seed);
  // One replica: the single-device trainer. More: data parallel over the in-process group.
  std::unique_ptr<Model> single;
  std::unique_ptr<Optimizer> single_opt;
  std::unique_ptr<Trainer> trainer;
  std::vector<std::unique_ptr<Group>> groups;
  std::unique_ptr<DataParallelTrainer> parallel;
  if (replicas == 1) {
    single = std::make_unique<Model>(spec);
    single->build(*backends[0], a.seed);
    if (source.weights)  // a model file's or ONNX model's: training continues from them
      loadWeights(*single, parseModelFile(*source.weights, a.model), true);
    single_opt = std::make_unique<Optimizer>(*backends[0], a.opt);
    trainer = std::make_unique<Trainer>(*single, *single_opt, TrainOptions{a.batch, a.seed, true});
  } else {
    groups = transport::makeLocalGroup(replicas);
    std::vector<Backend*> be;
    std::vector<Group*> g;
    for (int r = 0; r < replicas; ++r) {
      be.push_back(backends[static_cast<size_t>(r)].get());
      g.push_back(groups[static_cast<size_t>(r)].get());
    }
    DataParallelOptions o;
    o.batch = a.batch;
    o.seed = a.seed;
    o.shares = shares;
    o.bucket_bytes = static_cast<size_t>(std::max(a.bucket_mib, 1e-6) * (1 << 20));
    parallel = std::make_unique<DataParallelTrainer>(spec, be, g, a.opt, o);
  }
  Model& model = single ? *single : parallel->model(0);
  Optimizer& optimizer = single ? *single_opt : parallel->optimizer(0);
  std::string where;
  for (const std::string& d : devices) where += (where.empty() ? "" : ", ") + d;
  spdlog::info(
      "training '{}' ({} parameters) on {} with {} thread(s) each: {} train / {} test "
      "samples{}",
      model.name(), model.paramCount(), where, a.threads, train.size(), test.size(),
      replicas > 1 ? ", data parallel over " + std::to_string(replicas) + " replicas"
                   : std::string());
  Progress progress(a.epochs);
  EvalResult last;
  for (int64_t e = 0; e < a.epochs; ++e) {
    const auto report = a.no_progress ? std::function<void(const StepReport&)>()
                                      : [&](const StepReport& s) { progress.update(s); };
    const EpochReport r =
        single ? trainer->trainEpoch(train, e, report) : parallel->trainEpoch(train, e, report);
    progress.finishEpoch();
    last = evaluate(model, test, a.batch);  // the training batch bounds memory
    std::printf(
        "epoch %lld/%lld: train loss %.4f, test loss %.4f, test accuracy %.4f%s, "
        "%.2f s (%.0f samples/s)\n",
        static_cast<long long>(e + 1), static_cast<long long>(a.epochs), r.train_loss, last.loss,
        last.accuracy,
        test.tokens ? fmt::format(", test perplexity {:.2f}", std::exp(last.loss)).c_str() : "",
        r.seconds, r.samples_per_s);
    std::fflush(stdout);
  }
  std::printf("test accuracy: %.4f\n", last.accuracy);
  std::fflush(stdout);
  if (!a.save.empty()) {
    saveModel(a.save, model, &optimizer,
              {{"seed", static_cast<int64_t>(a.seed)},
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
      "train", "Train a model on one device, or data parallel on several (--replicas)");
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
  c->add_option("--devices", args->devices, "Comma-separated devices, one per replica")
      ->delimiter(',');
  c->add_option("--shares", args->shares,
                "Comma-separated relative batch shares per replica (default: equal)")
      ->delimiter(',');
  c->add_option("--profile", args->profile,
                "Batch shares in proportion to each replica's device speed in this profile "
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

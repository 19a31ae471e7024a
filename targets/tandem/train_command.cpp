// tandem train: single-device training of a model spec on a dataset.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>

#include "backends/registry.h"
#include "core/error.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "core/train/trainer.h"
#include "targets/tandem/commands.h"
#include "targets/tandem/progress.h"

namespace tandem::cli {

namespace {

struct TrainArgs {
  std::string model, data = "fashion-mnist", data_dir, save, device = "cpu";
  int64_t epochs = 1, batch = 64, train_limit = 0, test_limit = 0;
  int threads = 1;
  uint64_t seed = 1;
  OptimizerOptions opt;
  bool no_progress = false;
};

void runTrain(const TrainArgs& a) {
  validate(a.opt);
  TANDEM_CHECK_MSG(a.epochs > 0, InvalidArgument, "--epochs must be positive, got " << a.epochs);
  TANDEM_CHECK_MSG(a.batch > 0, InvalidArgument, "--batch must be positive, got " << a.batch);
  // The backend outlives everything that holds its memory (declared first).
  auto backend = makeBackend(a.device, BackendOptions{a.threads});
  Model model(loadModelSpec(a.model));
  const Dataset train = loadDataset(a.data, a.data_dir, true, a.train_limit);
  const Dataset test = loadDataset(a.data, a.data_dir, false, a.test_limit);
  model.build(*backend, a.seed);
  Optimizer optimizer(*backend, a.opt);
  Trainer trainer(model, optimizer, TrainOptions{a.batch, a.seed, true});
  spdlog::info("training '{}' ({} parameters) on {} with {} thread(s): {} train / {} test samples",
               model.name(), model.paramCount(), backend->info().name, a.threads, train.size(),
               test.size());
  Progress progress(a.epochs);
  EvalResult last;
  for (int64_t e = 0; e < a.epochs; ++e) {
    const EpochReport r = trainer.trainEpoch(
        train, e,
        a.no_progress ? std::function<void(const StepReport&)>()
                      : [&](const StepReport& s) { progress.update(s); });
    progress.finishEpoch();
    last = evaluate(model, test, a.batch);  // the training batch bounds memory
    std::printf(
        "epoch %lld/%lld: train loss %.4f, test loss %.4f, test accuracy %.4f, "
        "%.2f s (%.0f samples/s)\n",
        static_cast<long long>(e + 1), static_cast<long long>(a.epochs), r.train_loss, last.loss,
        last.accuracy, r.seconds, r.samples_per_s);
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
  CLI::App* c = app.add_subcommand("train", "Train a model on one device");
  c->add_option("--model", args->model, "Model spec (YAML)")->required()->check(CLI::ExistingFile);
  c->add_option("--data", args->data, "Dataset name")->check(CLI::IsMember({"fashion-mnist"}));
  c->add_option("--data-dir", args->data_dir, "Directory holding the dataset files");
  c->add_option("--epochs", args->epochs, "Passes over the training set");
  c->add_option("--batch", args->batch, "Samples per step");
  c->add_option("--optimizer", args->opt.kind, "sgd or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  c->add_option("--lr", args->opt.lr, "Learning rate");
  c->add_option("--momentum", args->opt.momentum, "SGD momentum");
  c->add_flag("--nesterov", args->opt.nesterov, "SGD with Nesterov momentum");
  c->add_option("--weight-decay", args->opt.weight_decay, "L2 (sgd) or decoupled (adamw) decay");
  c->add_option("--threads", args->threads, "CPU threads")->check(CLI::Range(1, 1024));
  c->add_option("--seed", args->seed, "Seed for initialisation, shuffling and dropout");
  c->add_option("--device", args->device, "Device to train on");
  c->add_option("--save", args->save, "Write the trained model (with optimizer state) here");
  c->add_option("--train-limit", args->train_limit, "Use only the first N training samples");
  c->add_option("--test-limit", args->test_limit, "Use only the first N test samples");
  c->add_flag("--no-progress", args->no_progress, "Do not report progress on stderr");
  c->callback([args] { runTrain(*args); });
}

}  // namespace tandem::cli

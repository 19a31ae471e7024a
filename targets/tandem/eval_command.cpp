// tandem eval: test accuracy of a saved model.
#include <cstdio>
#include <memory>

#include "backends/registry.h"
#include "core/model_file.h"
#include "core/train/trainer.h"
#include "targets/tandem/commands.h"

namespace tandem::cli {

void addEval(CLI::App& app) {
  struct Args {
    std::string file, data = "fashion-mnist", data_dir, device = "cpu";
    int64_t batch = 256, limit = 0;
    int threads = 1;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("eval", "Evaluate a saved model on a test set");
  c->add_option("model", a->file, "Model file (.tdm)")->required()->check(CLI::ExistingFile);
  c->add_option("--data", a->data, "Dataset name")->check(CLI::IsMember({"fashion-mnist"}));
  c->add_option("--data-dir", a->data_dir, "Directory holding the dataset files");
  c->add_option("--batch", a->batch, "Samples per forward pass")->check(positiveNumber());
  c->add_option("--threads", a->threads, "CPU threads")->check(CLI::Range(1, 1024));
  c->add_option("--device", a->device, "Device to evaluate on");
  c->add_option("--test-limit", a->limit, "Use only the first N test samples");
  c->callback([a] {
    const ModelFile file = readModelFile(a->file);
    auto backend = makeBackend(a->device, BackendOptions{a->threads});
    auto model = loadModel(file, *backend);
    const Dataset test = loadDataset(a->data, a->data_dir, false, a->limit);
    const EvalResult r = evaluate(*model, test, a->batch);
    std::printf("%lld samples: test loss %.4f\ntest accuracy: %.4f\n",
                static_cast<long long>(r.samples), r.loss, r.accuracy);
  });
}

}  // namespace tandem::cli

// tandem eval: test accuracy of a saved model.
#include <cmath>
#include <cstdio>
#include <memory>

#include "backends/registry.h"
#include "core/model_file.h"
#include "core/train/trainer.h"
#include "runtime/job/model_source.h"
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
  c->add_option("model", a->file, "Model file (.tdm), ONNX model (.onnx) or Hugging Face folder")
      ->required()
      ->check(CLI::ExistingPath);
  c->add_option("--data", a->data, "fashion-mnist, or text:PATH (held out: its last 10%)")
      ->check(datasetName());
  c->add_option("--data-dir", a->data_dir, "Directory holding the dataset files");
  c->add_option("--batch", a->batch, "Samples per forward pass")->check(positiveNumber());
  c->add_option("--threads", a->threads, "CPU threads")->check(CLI::Range(1, 1024));
  c->add_option("--device", a->device, "Device to evaluate on");
  c->add_option("--test-limit", a->limit, "Use only the first N test samples");
  c->callback([a] {
    const ModelFile file = runtime::readModelOrOnnx(a->file);
    auto backend = makeBackend(a->device, BackendOptions{a->threads});
    auto model = loadModel(file, *backend);
    const Shape input = model->inputShape();
    const Dataset test =
        loadDataset(a->data, a->data_dir, false, a->limit, input.rank() == 1 ? input[0] : 0, 0, {},
                    runtime::textTokensOf(file, *model, a->data, a->file));
    const EvalResult r = evaluate(*model, test, a->batch);
    std::printf("%lld samples: test loss %.4f\n", static_cast<long long>(r.samples), r.loss);
    if (test.tokens) std::printf("test perplexity: %.2f\n", std::exp(r.loss));
    std::printf("test accuracy: %.4f\n", r.accuracy);
  });
}

}  // namespace tandem::cli

// tandem import: an ONNX model (its graph and initializers) as a tandem model file; tandem
// export: a model file as an ONNX model.
#include <cstdio>
#include <memory>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "core/error.h"
#include "core/file.h"
#include "core/model_file.h"
#include "onnx/onnx_export.h"
#include "onnx/onnx_import.h"
#include "targets/tandem/commands.h"

namespace tandem::cli {

void addImport(CLI::App& app) {
  struct Args {
    std::string onnx, out, device;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand("import", "Read an ONNX model into a tandem model file (.tdm)");
  c->add_option("model", a->onnx, "The ONNX model (.onnx)")->required()->check(CLI::ExistingFile);
  c->add_option("--out", a->out, "The model file to write")->required();
  c->add_option("--device", a->device,
                "Import for this device (cpu, opencl:N): refuse a layer its backend cannot run, "
                "note one it can serve but not train");
  c->callback([a] {
    checkWritable(a->out, "model file");
    const std::unique_ptr<Backend> device = a->device.empty() ? nullptr : makeBackend(a->device);
    const onnx_io::ImportedModel imported = onnx_io::importOnnx(a->onnx, device.get());
    for (const std::string& note : imported.notes) std::printf("note: %s\n", note.c_str());
    const ModelFile file = onnx_io::toModelFile(imported);
    cpu::CpuBackend be(cpu::CpuOptions{1});
    const std::unique_ptr<Model> model = loadModel(file, be);
    saveModel(a->out, *model, nullptr, file.metadata);
    std::printf("imported %s: %zu layers, %lld parameters, input %s, output %s; wrote %s\n",
                a->onnx.c_str(), model->size(), static_cast<long long>(model->paramCount()),
                model->inputShape().str().c_str(), model->outputShape().str().c_str(),
                a->out.c_str());
    if (device) std::printf("%s runs every layer's forward\n", device->info().name.c_str());
  });
}

void addExport(CLI::App& app) {
  struct Args {
    std::string model, onnx;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand(
      "export", "Write a tandem model file (its layers and weights) as an ONNX model (opset 17)");
  c->add_option("model", a->model, "The model file (.tdm), e.g. a run's merged save")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("--onnx", a->onnx, "The ONNX model to write")->required();
  c->callback([a] {
    checkWritable(a->onnx, "ONNX model");
    const ModelFile file = readModelFile(a->model);
    onnx_io::writeOnnx(file, a->onnx);
    std::printf("exported %s: %zu layers, %zu parameter tensors, opset 17; wrote %s\n",
                a->model.c_str(), file.spec.layers.size(), file.params.size(), a->onnx.c_str());
  });
}

}  // namespace tandem::cli

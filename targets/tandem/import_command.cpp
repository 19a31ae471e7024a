// tandem import: an ONNX model (its graph and initializers) or a Hugging Face
// Llama-architecture folder (config.json, safetensors weights) as a tandem model file;
// tandem export: a model file as an ONNX model, or as a Hugging Face folder (int8 weights
// as the f32 values they stand for); tandem quantize: a model file with int8 weights.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "core/error.h"
#include "core/file.h"
#include "core/model_file.h"
#include "core/quantize_model.h"
#include "hf/llama.h"
#include "targets/tandem/commands.h"
#ifdef TANDEM_HAS_ONNX
#include "onnx/onnx_export.h"
#include "onnx/onnx_import.h"
#endif

namespace tandem::cli {

namespace {

bool isDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The model file of an ONNX model, refusing a layer `device` cannot run.
ModelFile importOnnxFile(const std::string& path, const Backend* device) {
#ifdef TANDEM_HAS_ONNX
  const onnx_io::ImportedModel imported = onnx_io::importOnnx(path, device);
  for (const std::string& note : imported.notes) std::printf("note: %s\n", note.c_str());
  return onnx_io::toModelFile(imported);
#else
  (void)device;
  throw InvalidArgument(path + ": this build reads no ONNX models (built with TANDEM_ONNX=OFF)");
#endif
}

}  // namespace

void addImport(CLI::App& app) {
  struct Args {
    std::string model, out, device;
    int64_t context = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand(
      "import",
      "Read an ONNX model or a Hugging Face Llama folder into a tandem model file (.tdm)");
  c->add_option("model", a->model,
                "The ONNX model (.onnx), or a folder with config.json and model.safetensors "
                "(or its shards and model.safetensors.index.json)")
      ->required()
      ->check(CLI::ExistingPath);
  c->add_option("--out", a->out, "The model file to write")->required();
  c->add_option("--device", a->device,
                "Import for this device (cpu, opencl:N): refuse a layer its backend cannot run, "
                "note one it can serve but not train");
  c->add_option("--context", a->context,
                "A Hugging Face model's sequence length: the input, and each sequence's key/value "
                "cache (default: max_position_embeddings, at most 4096)")
      ->check(CLI::PositiveNumber);
  c->callback([a] {
    checkWritable(a->out, "model file");
    const std::unique_ptr<Backend> device = a->device.empty() ? nullptr : makeBackend(a->device);
    const bool folder = isDirectory(a->model);
    std::unique_ptr<Model> model;
    if (folder && !device) {
      // Straight from the folder's map into the file: the model is not built (planLlamaImport
      // names and shapes what its layers hold; loading the file checks them again).
      const hf::LlamaImport plan = hf::planLlamaImport(a->model, a->context);
      writeModelFile(a->out, plan.spec, plan.params, plan.metadata);
      model = std::make_unique<Model>(plan.spec);
    } else {
      const ModelFile file =
          folder ? hf::importLlama(a->model, a->context) : importOnnxFile(a->model, device.get());
      cpu::CpuBackend be(cpu::CpuOptions{1});
      model = loadModel(file, device ? *device : be);
      saveModel(a->out, *model, nullptr, file.metadata);
    }
    std::printf("imported %s: %zu layers, %lld parameters, input %s, output %s; wrote %s\n",
                a->model.c_str(), model->size(), static_cast<long long>(model->paramCount()),
                model->inputShape().str().c_str(), model->outputShape().str().c_str(),
                a->out.c_str());
    if (device) std::printf("%s runs every layer's forward\n", device->info().name.c_str());
  });
}

void addExport(CLI::App& app) {
  struct Args {
    std::string model, onnx, folder, dtype = "f32";
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand(
      "export",
      "Write a tandem model file as an ONNX model (opset 17) or, for a Llama-architecture "
      "model, as a Hugging Face folder (config.json, model.safetensors)");
  c->add_option("model", a->model, "The model file (.tdm), e.g. a run's merged save")
      ->required()
      ->check(CLI::ExistingFile);
  CLI::Option* onnx = c->add_option("--onnx", a->onnx, "The ONNX model to write");
  CLI::Option* folder = c->add_option("--safetensors", a->folder,
                                      "The folder to write config.json and model.safetensors into")
                            ->check(CLI::ExistingDirectory);
  onnx->excludes(folder);
  c->add_option("--dtype", a->dtype, "The safetensors weights' type")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}));
  c->callback([a] {
    ModelFile file = readModelFile(a->model);
    if (hasInt8Weights(file.spec)) {
      std::printf(
          "note: %s holds int8 weights; they are written as the f32 values they stand "
          "for\n",
          a->model.c_str());
      file = dequantizeModel(file);
    }
    if (!a->folder.empty()) {
      std::string dtype = a->dtype;
      for (char& ch : dtype) ch = static_cast<char>(std::toupper(ch));
      hf::exportLlama(file, a->folder, dtype);
      std::printf(
          "exported %s: %zu parameter tensors as %s; wrote %s/config.json and "
          "%s/model.safetensors\n",
          a->model.c_str(), file.params.size(), dtype.c_str(), a->folder.c_str(),
          a->folder.c_str());
      return;
    }
    if (a->onnx.empty()) throw InvalidArgument("export: give --onnx FILE or --safetensors DIR");
#ifdef TANDEM_HAS_ONNX
    checkWritable(a->onnx, "ONNX model");
    onnx_io::writeOnnx(file, a->onnx);
    std::printf("exported %s: %zu layers, %zu parameter tensors, opset 17; wrote %s\n",
                a->model.c_str(), file.spec.layers.size(), file.params.size(), a->onnx.c_str());
#else
    throw InvalidArgument("this build writes no ONNX models (built with TANDEM_ONNX=OFF)");
#endif
  });
}

void addQuantize(CLI::App& app) {
  struct Args {
    std::string model, out;
    bool int8 = false;
    int64_t group = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* c = app.add_subcommand(
      "quantize",
      "Write a model file with int8 weights (weight-only, scales per output row or per group "
      "of inputs) for inference: linear, attention, SwiGLU and block products");
  c->add_option("model", a->model, "The model file (.tdm) with f32 weights")
      ->required()
      ->check(CLI::ExistingFile);
  c->add_option("out", a->out, "The model file to write")->required();
  c->add_flag("--int8", a->int8, "int8 weights (the one format so far; required)")->required();
  c->add_option("--group", a->group,
                "Inputs per scale, dividing every quantized layer's inputs (default: one scale "
                "per output row)")
      ->check(CLI::PositiveNumber);
  c->callback([a] {
    checkWritable(a->out, "model file");
    const ModelFile file = readModelFile(a->model);
    cpu::CpuBackend be(cpu::CpuOptions{1});
    const ModelFile quantized = quantizeModel(file, a->group, be);
    const int64_t f32_bytes = Model(file.spec).paramBytes();  // shapes only: nothing built
    const std::unique_ptr<Model> model = loadModel(quantized, be);
    saveModel(a->out, *model, nullptr, quantized.metadata);
    const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
    std::printf("quantized %s: weights %.2f MiB -> %.2f MiB (%.3fx), int8 with %s; wrote %s\n",
                a->model.c_str(), mib(f32_bytes), mib(model->paramBytes()),
                static_cast<double>(model->paramBytes()) /
                    static_cast<double>(std::max<int64_t>(1, f32_bytes)),
                a->group ? ("a scale per " + std::to_string(a->group) + " inputs").c_str()
                         : "a scale per output row",
                a->out.c_str());
  });
}

}  // namespace tandem::cli

#include "runtime/job/model_source.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/file.h"
#include "core/model_spec.h"
#include "hf/llama.h"

#include "backends/cpu/cpu_backend.h"
#ifdef TANDEM_HAS_ONNX
#include "onnx/onnx_import.h"
#endif

namespace tandem::runtime {

bool isOnnxModel(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".onnx") == 0;
}

bool isModelFile(const std::string& path) {
  return path.size() > 4 && path.compare(path.size() - 4, 4, ".tdm") == 0;
}

bool isHuggingFaceFolder(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
         ::stat((path + "/config.json").c_str(), &st) == 0;
}

bool bringsWeights(const std::string& path) {
  return isModelFile(path) || isOnnxModel(path) || isHuggingFaceFolder(path);
}

namespace {

// A model file's contents as a ModelSource: its spec, and its weights as a model file's
// bytes (serialised from a model loaded with them, so every shape is checked).
ModelSource sourceOf(const ModelFile& file) {
  ModelSource out;
  cpu::CpuBackend be(cpu::CpuOptions{1});
  const std::unique_ptr<Model> model = loadModel(file, be);
  out.weights =
      std::make_shared<const std::vector<uint8_t>>(serializeModel(*model, nullptr, file.metadata));
  out.spec = file.spec;
  out.spec_yaml = modelSpecYaml(file.spec);
  return out;
}

}  // namespace

ModelSource readModelSource(const std::string& path) {
  if (isHuggingFaceFolder(path)) {
    // Straight from the folder's map into the bytes shipped (planLlamaImport names and
    // shapes what the layers hold; each stage's load checks them).
    const hf::LlamaImport plan = hf::planLlamaImport(path);
    ModelSource out;
    out.weights = std::make_shared<const std::vector<uint8_t>>(
        serializeModelFile(plan.spec, plan.params, plan.metadata));
    out.spec = plan.spec;
    out.spec_yaml = modelSpecYaml(plan.spec);
    return out;
  }
  if (isModelFile(path)) return sourceOf(readModelFile(path));
  ModelSource out;
  if (!isOnnxModel(path)) {
    out.spec_yaml = readFile(path, "model spec");
    out.spec = parseModelSpec(out.spec_yaml, path);
    return out;
  }
#ifdef TANDEM_HAS_ONNX
  const onnx_io::ImportedModel imported = onnx_io::importOnnx(path);
  for (const std::string& note : imported.notes) spdlog::info("{}: {}", path, note);
  out = sourceOf(onnx_io::toModelFile(imported));
  out.output = imported.output;
  return out;
#else
  throw InvalidArgument(path +
                        ": this build reads no ONNX models (built with TANDEM_ONNX=OFF, "
                        "as the ARM builds are): convert it with `tandem import` where "
                        "ONNX is built in");
#endif
}

ModelFile readModelOrOnnx(const std::string& path) {
  if (isHuggingFaceFolder(path)) return hf::importLlama(path);
  if (!isOnnxModel(path)) return readModelFile(path);
  const ModelSource source = readModelSource(path);
  return parseModelFile(*source.weights, path);
}

hf::TextCodec textCodecOf(const std::string& model, const std::string& weights, int64_t vocab) {
  if (!weights.empty()) return hf::TextCodec::forModel(readModelFile(weights), vocab);
  if (isModelFile(model)) return hf::TextCodec::forModel(readModelFile(model), vocab);
  if (!isHuggingFaceFolder(model)) return {};
  // The folder's tokenizer as the import keeps it (importLlama's metadata), without the weights.
  ModelFile tokenizer_only;
  tokenizer_only.spec.name = model;
  const std::string path = model + "/tokenizer.json";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  std::string json = readFile(path, "tokenizer");
  try {
    (void)hf::Tokenizer::parse(json, path);
  } catch (const Unsupported& e) {
    spdlog::info("{}; prompts and text are bytes", e.what());
    return {};
  }
  tokenizer_only.metadata["tokenizer"] = std::move(json);
  return hf::TextCodec::forModel(tokenizer_only, vocab);
}

TextTokens textTokensOf(const ModelFile& file, const Model& model, const std::string& data,
                        const std::string& name) {
  TextTokens tokens = hf::textTokensFor(file, model, data, name);
  if (tokens.encode) spdlog::info("text data: {} (vocab {})", tokens.name, tokens.vocab);
  return tokens;
}

}  // namespace tandem::runtime

#include "runtime/job/model_source.h"

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "core/file.h"
#include "core/model_spec.h"

#ifdef TANDEM_HAS_ONNX
#include "backends/cpu/cpu_backend.h"
#include "onnx/onnx_import.h"
#endif

namespace tandem::runtime {

bool isOnnxModel(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".onnx") == 0;
}

ModelSource readModelSource(const std::string& path) {
  ModelSource out;
  if (!isOnnxModel(path)) {
    out.spec_yaml = readFile(path, "model spec");
    out.spec = parseModelSpec(out.spec_yaml, path);
    return out;
  }
#ifdef TANDEM_HAS_ONNX
  const onnx_io::ImportedModel imported = onnx_io::importOnnx(path);
  for (const std::string& note : imported.notes) spdlog::info("{}: {}", path, note);
  const ModelFile file = onnx_io::toModelFile(imported);
  cpu::CpuBackend be(cpu::CpuOptions{1});
  const std::unique_ptr<Model> model = loadModel(file, be);
  out.weights =
      std::make_shared<const std::vector<uint8_t>>(serializeModel(*model, nullptr, file.metadata));
  out.spec = imported.spec;
  out.output = imported.output;
  out.spec_yaml = modelSpecYaml(imported.spec);
  return out;
#else
  throw InvalidArgument(path +
                        ": this build reads no ONNX models (built with TANDEM_ONNX=OFF, "
                        "as the ARM builds are): convert it with `tandem import` where "
                        "ONNX is built in");
#endif
}

ModelFile readModelOrOnnx(const std::string& path) {
  if (!isOnnxModel(path)) return readModelFile(path);
  const ModelSource source = readModelSource(path);
  return parseModelFile(*source.weights, path);
}

}  // namespace tandem::runtime

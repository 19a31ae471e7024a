// libFuzzer target for the ONNX importer (what `tandem import` and `model: x.onnx` read
// from a file a user was handed): any input either parses as no ONNX model, or imports
// and becomes a model file, or raises one of tandem's errors (FormatError, InvalidArgument,
// naming what is wrong). Anything else (a crash, a sanitizer report, another exception) is
// a bug.
#include <onnx/onnx_pb.h>

#include <cstdint>

#include "core/error.h"
#include "onnx/onnx_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  onnx::ModelProto m;
  if (!m.ParseFromArray(data, static_cast<int>(size))) return 0;
  try {
    const tandem::onnx_io::ImportedModel imported = tandem::onnx_io::importOnnx(m, "fuzz.onnx");
    tandem::onnx_io::toModelFile(imported);  // builds the model the import describes
  } catch (const tandem::Error&) {
  }
  return 0;
}

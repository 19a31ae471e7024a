// YAML model specs (examples/models/*.yaml):
//
//   name: cnn
//   input: [1, 28, 28]
//   layers:
//     - conv2d: {out: 32, kernel: 3, padding: 1}
//     - relu
//     - residual:
//         layers: [...]
//
// Every error names the file, line and column of the offending node.
#pragma once

#include <string>

#include "core/model.h"

namespace tandem {

ModelSpec parseModelSpec(const std::string& yaml_text, const std::string& source = "<string>");
ModelSpec loadModelSpec(const std::string& path);

// The spec as YAML that parseModelSpec() reads back to the same spec: numbers keep their
// type (a double is written with a '.' or an exponent) and all 17 significant digits.
std::string modelSpecYaml(const ModelSpec& spec);

}  // namespace tandem

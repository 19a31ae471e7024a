// The layer registry: an explicit list of every layer type (no static self-registration,
// which static linking silently drops).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/layers/layer.h"

namespace tandem {

// Builds a layer from its spec; unknown types raise InvalidArgument listing the known.
std::unique_ptr<Layer> makeLayer(const LayerSpec& spec);
const std::vector<std::string>& layerTypes();

}  // namespace tandem

#include "core/layers/registry.h"

#include "core/error.h"
#include "core/layers/attention.h"
#include "core/layers/branches.h"
#include "core/layers/channels.h"
#include "core/layers/conv2d.h"
#include "core/layers/elementwise.h"
#include "core/layers/gate.h"
#include "core/layers/gated_mlp.h"
#include "core/layers/linear.h"
#include "core/layers/normalization.h"
#include "core/layers/pooling.h"
#include "core/layers/residual.h"
#include "core/layers/transformer.h"

namespace tandem {

const std::vector<std::string>& layerTypes() {
  static const std::vector<std::string> kTypes = {
      "linear",    "conv2d",    "maxpool2d",  "avgpool2d", "globalavgpool",  "relu",
      "gelu",      "tanh",      "sigmoid",    "flatten",   "dropout",        "layernorm",
      "embedding", "residual",  "positional", "attention", "transformer",    "silu",
      "rmsnorm",   "swiglu",    "llama",      "relu6",     "hardsigmoid",    "hardswish",
      "gate",      "batchnorm", "identity",   "slice",     "channel_shuffle"};
  return kTypes;
}

std::unique_ptr<Layer> makeLayer(const LayerSpec& spec) {
  const std::string& t = spec.type;
  if (!spec.children.empty() && t != "residual" && t != "gate" && t != "chain" && t != "concat")
    throw InvalidArgument("layer '" + t + "' does not take a 'layers' list");
  if (t == "linear") return std::make_unique<Linear>(spec);
  if (t == "conv2d") return std::make_unique<Conv2d>(spec);
  if (t == "maxpool2d") return std::make_unique<Pool2d>(Pool2d::Kind::kMax, spec);
  if (t == "avgpool2d") return std::make_unique<Pool2d>(Pool2d::Kind::kAvg, spec);
  if (t == "globalavgpool") return std::make_unique<GlobalAvgPool>(spec);
  if (t == "relu") return std::make_unique<ActivationLayer>(Activation::kReLU, spec);
  if (t == "gelu") return std::make_unique<ActivationLayer>(Activation::kGELU, spec);
  if (t == "tanh") return std::make_unique<ActivationLayer>(Activation::kTanh, spec);
  if (t == "sigmoid") return std::make_unique<ActivationLayer>(Activation::kSigmoid, spec);
  if (t == "silu") return std::make_unique<ActivationLayer>(Activation::kSiLU, spec);
  if (t == "relu6") return std::make_unique<ActivationLayer>(Activation::kReLU6, spec);
  if (t == "hardsigmoid") return std::make_unique<ActivationLayer>(Activation::kHardSigmoid, spec);
  if (t == "hardswish") return std::make_unique<ActivationLayer>(Activation::kHardSwish, spec);
  if (t == "flatten") return std::make_unique<Flatten>(spec);
  if (t == "identity") return std::make_unique<Identity>(spec);
  if (t == "slice") return std::make_unique<ChannelSlice>(spec);
  if (t == "channel_shuffle") return std::make_unique<ChannelShuffle>(spec);
  if (t == "dropout") return std::make_unique<Dropout>(spec);
  if (t == "layernorm") return std::make_unique<LayerNorm>(spec);
  if (t == "rmsnorm") return std::make_unique<RmsNorm>(spec);
  if (t == "batchnorm") return std::make_unique<BatchNorm>(spec);
  if (t == "swiglu") return std::make_unique<SwiGlu>(spec);
  if (t == "embedding") return std::make_unique<Embedding>(spec);
  if (t == "residual") return std::make_unique<Residual>(spec);
  if (t == "gate") return std::make_unique<Gate>(spec);
  if (t == "chain") return std::make_unique<Chain>(spec);
  if (t == "concat") return std::make_unique<Concat>(spec);
  if (t == "positional") return std::make_unique<PositionalEmbedding>(spec);
  if (t == "attention") return std::make_unique<Attention>(spec);
  if (t == "transformer") return std::make_unique<TransformerBlock>(spec);
  if (t == "llama") return std::make_unique<LlamaBlock>(spec);
  std::string known;
  for (const auto& k : layerTypes()) known += (known.empty() ? "" : ", ") + k;
  throw InvalidArgument("unknown layer type '" + t + "' (known: " + known + ")");
}

}  // namespace tandem

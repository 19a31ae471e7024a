#include "core/wire_codec.h"

#include <string>

#include "core/error.h"

namespace tandem {

std::string_view wireCodecName(WireCodec c) {
  switch (c) {
    case WireCodec::kRaw:
      return "fp32";
    case WireCodec::kF16:
      return "fp16";
    case WireCodec::kBF16:
      return "bf16";
    case WireCodec::kI8:
      return "int8";
  }
  return "invalid";
}

WireCodec parseWireCodec(std::string_view name) {
  if (name == "fp32" || name == "raw") return WireCodec::kRaw;
  if (name == "fp16") return WireCodec::kF16;
  if (name == "bf16") return WireCodec::kBF16;
  if (name == "int8") return WireCodec::kI8;
  throw InvalidArgument("unknown codec '" + std::string(name) +
                        "' (expected fp32, fp16, bf16 or int8)");
}

}  // namespace tandem

// How a tensor's values travel on a link: a job's and a plan's codec for each direction,
// which transport/codec.h (transport::Codec is this enum) encodes and decodes.
#pragma once

#include <cstdint>
#include <string_view>

namespace tandem {

enum class WireCodec : uint8_t { kRaw = 0, kF16 = 1, kBF16 = 2, kI8 = 3 };

// The names jobs, plans and the runs' output use: "fp32" (the values as they are),
// "fp16", "bf16", "int8".
std::string_view wireCodecName(WireCodec c);
// One of those names (or "raw"); InvalidArgument naming the text otherwise.
WireCodec parseWireCodec(std::string_view name);

}  // namespace tandem

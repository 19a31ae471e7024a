#include "core/backend_ops.h"

#include <string>

#include "core/error.h"

namespace tandem {

std::string_view opName(Op op) {
  switch (op) {
#define TANDEM_BACKEND_OP_NAME(Name, Ret, name, Params, Args) \
  case Op::k##Name:                                           \
    return #name;
    TANDEM_BACKEND_OPS(TANDEM_BACKEND_OP_NAME)
#undef TANDEM_BACKEND_OP_NAME
  }
  return "?";
}

std::string opUseName(const OpUse& use) {
  return std::string(opName(use.op)) + " on " + std::string(dtypeName(use.dtype));
}

std::string opUseNames(const std::vector<OpUse>& uses) {
  std::string out;
  for (const OpUse& u : uses) {
    if (!out.empty()) out += ", ";
    out += opUseName(u);
  }
  return out;
}

OpUse parseOpUse(std::string_view text) {
  const size_t on = text.find(" on ");
  if (on != std::string_view::npos)
    for (Op op : kAllOps)
      if (opName(op) == text.substr(0, on)) return {op, parseDType(text.substr(on + 4))};
  throw InvalidArgument("'" + std::string(text) +
                        "' is no backend op and data type (e.g. 'gemm on f32')");
}

bool commonOpSupport(Op op, DType dtype) {
  switch (op) {
    case Op::kUpload:
    case Op::kDownload:
    case Op::kCopy:
      return true;
    case Op::kFill:
      return dtype == DType::kF32 || dtype == DType::kI32;
    case Op::kConvert:
      return dtype != DType::kI8;  // i8 needs scales: the transport codecs carry those
    case Op::kGemmQ8:
      return dtype == DType::kI8;
    case Op::kEmbedding:
    case Op::kEmbeddingBackward:
      return dtype == DType::kI32;
    default:
      return dtype == DType::kF32;
  }
}

}  // namespace tandem

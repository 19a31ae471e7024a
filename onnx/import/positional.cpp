// A learned positional embedding added to the token embeddings.
#include "onnx/import/importer.h"

#include <algorithm>

#include "core/error.h"

namespace tandem::onnx_io {

std::optional<std::string> Importer::positional(const std::string& v, int i) {
  const onnx::NodeProto& a = node(i);
  if (a.op_type() != "Add" || a.input_size() != 2 || shape_.rank() != 2 || ids_)
    return std::nullopt;
  const int64_t t = shape_[0], d = shape_[1];
  const std::string& other = a.input(0) == v ? a.input(1) : a.input(0);
  auto rowsOf = [&](const onnx::TensorProto& p) {
    return p.dims_size() == 2 && p.dims(1) == d ? p.dims(0) : int64_t{-1};
  };
  std::optional<HostTensor> table;
  int slice = -1;
  if (const auto c = constants_.find(other); c != constants_.end()) {
    if (rowsOf(*c->second) != t) return std::nullopt;
    table = tensor(a, other);
  } else if (const auto p = producer_.find(other); p != producer_.end()) {
    const onnx::NodeProto& s = node(p->second);
    if (s.op_type() != "Slice" || s.input_size() < 3 || !constants_.count(s.input(0)) ||
        live(other).size() != 1)
      return std::nullopt;
    const int64_t rows = rowsOf(*constants_.at(s.input(0)));
    const std::vector<int64_t> starts = int64s(s, s.input(1)), ends = int64s(s, s.input(2));
    const std::vector<int64_t> axes =
        s.input_size() > 3 && !s.input(3).empty() ? int64s(s, s.input(3)) : std::vector<int64_t>{0};
    const std::vector<int64_t> steps =
        s.input_size() > 4 && !s.input(4).empty() ? int64s(s, s.input(4)) : std::vector<int64_t>{1};
    if (rows < t || starts != std::vector<int64_t>{0} || axes != std::vector<int64_t>{0} ||
        steps != std::vector<int64_t>{1} || ends.size() != 1 || std::min(ends[0], rows) != t)
      return std::nullopt;
    table = tensor(s, s.input(0));
    slice = p->second;
  } else {
    return std::nullopt;
  }
  take({i});
  if (slice >= 0) take({slice});
  add({"positional", {{"context", table->shape[0]}}, {}, where(a)}, {std::move(*table)});
  return a.output(0);
}

}  // namespace tandem::onnx_io

#include "core/layers/tensor_split.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <span>
#include <sstream>

#include "core/error.h"

namespace tandem {

std::string tensorSplitName(TensorSplit split) {
  return split == TensorSplit::kColumn ? "column" : "row";
}

std::vector<int64_t> shareBounds(int64_t units, const std::vector<double>& shares,
                                 const std::string& what) {
  const auto ranks = static_cast<int64_t>(shares.size());
  TANDEM_CHECK_MSG(ranks > 0, InvalidArgument, what << ": no ranks to share it");
  for (size_t r = 0; r < shares.size(); ++r)
    TANDEM_CHECK_MSG(std::isfinite(shares[r]) && shares[r] > 0, InvalidArgument,
                     what << ": rank " << r << "'s share " << shares[r] << " is not positive");
  TANDEM_CHECK_MSG(units >= ranks, InvalidArgument,
                   what << " has " << units << " features, fewer than the " << ranks
                        << " ranks of its tensor group (each needs one at least)");
  // The floors of the ideal counts (one at least), then a feature at a time to the rank
  // furthest below its ideal, or from the one furthest above it (ties: the lower rank).
  const double total = std::accumulate(shares.begin(), shares.end(), 0.0);
  std::vector<double> ideal;
  std::vector<int64_t> count;
  for (const double s : shares) {
    ideal.push_back(static_cast<double>(units) * s / total);
    count.push_back(std::max<int64_t>(1, static_cast<int64_t>(std::floor(ideal.back()))));
  }
  auto sum = std::accumulate(count.begin(), count.end(), int64_t{0});
  for (; sum != units; sum += sum < units ? 1 : -1) {
    size_t pick = shares.size();
    for (size_t r = 0; r < shares.size(); ++r) {
      const double gap = ideal[r] - static_cast<double>(count[r]);
      if (sum > units && count[r] == 1) continue;
      if (pick == shares.size() ||
          (sum < units ? gap > ideal[pick] - static_cast<double>(count[pick])
                       : gap < ideal[pick] - static_cast<double>(count[pick])))
        pick = r;
    }
    count[pick] += sum < units ? 1 : -1;
  }
  std::vector<int64_t> bounds{0};
  for (const int64_t c : count) bounds.push_back(bounds.back() + c);
  return bounds;
}

TensorPart blockPart(Group& group, const std::vector<double>& shares, int64_t units,
                     const std::string& what, uint64_t& next_tag) {
  TANDEM_CHECK_MSG(
      static_cast<size_t>(group.size()) == shares.size(), InvalidArgument,
      what << ": " << shares.size() << " shares for a group of " << group.size() << " ranks");
  const std::vector<int64_t> bounds = shareBounds(units, shares, what);
  TensorPart part;
  part.group = &group;
  part.begin = bounds[static_cast<size_t>(group.rank())];
  part.end = bounds[static_cast<size_t>(group.rank()) + 1];
  part.tag = next_tag++;
  return part;
}

namespace {

// Runs `collective` on `t`'s values (f32; `what` names it for the error): in place where
// the backend computes in host memory (the group reads and writes it), else on a
// downloaded copy that is uploaded back.
void onHostValues(Backend& backend, const Tensor& t, const char* what,
                  const std::function<void(std::span<float>)>& collective) {
  TANDEM_CHECK_MSG(t.dtype() == DType::kF32, InvalidArgument,
                   "a tensor " << what << " takes f32, got " << dtypeName(t.dtype()));
  const auto n = static_cast<size_t>(t.numel());
  if (const void* host = backend.hostData(t)) {
    collective({static_cast<float*>(const_cast<void*>(host)), n});
    return;
  }
  std::vector<float> buffer(n);
  backend.download(t, buffer.data());
  collective(buffer);
  backend.upload(t, buffer.data());
}

}  // namespace

void allreduceTensor(Backend& backend, const Tensor& t, Group& group, const AllreduceOptions& o) {
  onHostValues(backend, t, "all-reduce", [&](std::span<float> v) { allreduce(group, v, o); });
}

void broadcastTensor(Backend& backend, const Tensor& t, Group& group, const RootOptions& o) {
  onHostValues(backend, t, "broadcast", [&](std::span<float> v) { broadcast(group, v, o); });
}

void checkTensorPart(const TensorPart& part, int64_t features, const std::string& layer) {
  TANDEM_CHECK_MSG(part.group != nullptr, InvalidArgument,
                   layer << ": a tensor part needs a group");
  TANDEM_CHECK_MSG(0 <= part.begin && part.begin < part.end && part.end <= features,
                   InvalidArgument,
                   layer << ": " << tensorSplitName(part.split) << " part [" << part.begin << ", "
                         << part.end << ") is not inside its " << features << " "
                         << (part.split == TensorSplit::kColumn ? "outputs" : "inputs"));
}

ParamSlice rowsOf(int64_t rows, int64_t cols, int64_t begin, int64_t end) {
  return {rows, cols, {{begin, end}}, 0, cols};
}

ParamSlice columnsOf(int64_t rows, int64_t cols, int64_t begin, int64_t end) {
  return {rows, cols, {{0, rows}}, begin, end};
}

namespace {

int64_t sliceSize(const ParamSlice& slice) {
  int64_t rows = 0;
  for (const auto& [b, e] : slice.row_ranges) {
    TANDEM_CHECK_MSG(0 <= b && b <= e && e <= slice.rows, InvalidArgument,
                     "tensor slice: rows [" << b << ", " << e << ") are not inside " << slice.rows);
    rows += e - b;
  }
  TANDEM_CHECK_MSG(
      0 <= slice.col_begin && slice.col_begin <= slice.col_end && slice.col_end <= slice.cols,
      InvalidArgument,
      "tensor slice: columns [" << slice.col_begin << ", " << slice.col_end << ") are not inside "
                                << slice.cols);
  return rows * (slice.col_end - slice.col_begin);
}

// Calls fn(index in the whole, index in the part) for every value the slice holds.
template <typename Fn>
void eachSliced(const ParamSlice& slice, size_t whole_size, size_t part_size, Fn fn) {
  TANDEM_CHECK_MSG(static_cast<int64_t>(whole_size) == slice.rows * slice.cols &&
                       static_cast<int64_t>(part_size) == sliceSize(slice),
                   InvalidArgument,
                   "tensor slice: " << part_size << " values of a whole of " << whole_size
                                    << " do not match a slice of [" << slice.rows << ", "
                                    << slice.cols << "]");
  size_t at = 0;
  for (const auto& [b, e] : slice.row_ranges)
    for (int64_t r = b; r < e; ++r)
      for (int64_t c = slice.col_begin; c < slice.col_end; ++c)
        fn(static_cast<size_t>(r * slice.cols + c), at++);
}

}  // namespace

std::vector<float> takeSlice(const std::vector<float>& whole, const ParamSlice& slice) {
  std::vector<float> out(static_cast<size_t>(sliceSize(slice)));
  eachSliced(slice, whole.size(), out.size(), [&](size_t w, size_t p) { out[p] = whole[w]; });
  return out;
}

void placeSlice(const ParamSlice& slice, const std::vector<float>& part,
                std::vector<float>& whole) {
  eachSliced(slice, whole.size(), part.size(), [&](size_t w, size_t p) { whole[w] = part[p]; });
}

Param makePartParam(Backend& backend, std::string name, const Shape& shape,
                    const std::vector<float>& whole, const ParamSlice& slice) {
  Param p = makeParam(backend, std::move(name), shape, takeSlice(whole, slice));
  p.slice = slice;
  return p;
}

void allreducePart(Backend& backend, const Tensor& t, const TensorPart& part, uint64_t direction) {
  AllreduceOptions o;
  o.tag = part.tag * 2 + direction;
  o.timeout = part.timeout;
  allreduceTensor(backend, t, *part.group, o);
}

namespace {

// Layers that work on each feature (channel) apart, so on a rank's slice as on the whole:
// activations between any pair, pooling between convolutions.
bool perFeature(const Layer& layer, const std::string& pair) {
  static const char* const kinds[] = {"relu", "gelu", "silu", "tanh", "sigmoid"};
  if (std::find(std::begin(kinds), std::end(kinds), layer.type()) != std::end(kinds)) return true;
  return pair == "conv2d" && (layer.type() == "maxpool2d" || layer.type() == "avgpool2d");
}

const TensorSplittable* splittable(const Layer& layer) {
  const auto* s = dynamic_cast<const TensorSplittable*>(&layer);
  return s && s->tensorSplittable() ? s : nullptr;
}

const TensorSplitBlock* splitBlock(const Layer& layer) {
  const auto* b = dynamic_cast<const TensorSplitBlock*>(&layer);
  return b && b->tensorSplits() ? b : nullptr;
}

}  // namespace

std::vector<TensorRole> findTensorSplit(const Sequence& layers, size_t begin, size_t end) {
  TANDEM_CHECK_MSG(begin < end && end <= layers.size(), InvalidArgument,
                   "tensor split: layers [" << begin << ", " << end << ") are not inside the "
                                            << layers.size() << " layers");
  std::vector<TensorRole> roles;
  for (size_t i = begin; i < end; ++i) roles.push_back({i, TensorRole::kWhole});
  for (size_t i = begin; i < end; ++i) {
    if (splitBlock(layers.layer(i))) {
      roles[i - begin].kind = TensorRole::kBlock;
      continue;
    }
    if (!splittable(layers.layer(i))) continue;
    const std::string kind = layers.layer(i).type();
    size_t j = i + 1;
    while (j < end && perFeature(layers.layer(j), kind)) ++j;
    if (j == end || !splittable(layers.layer(j)) || layers.layer(j).type() != kind) continue;
    roles[i - begin].kind = TensorRole::kColumn;
    for (size_t k = i + 1; k < j; ++k) roles[k - begin].kind = TensorRole::kSlice;
    roles[j - begin].kind = TensorRole::kRow;
    i = j;
  }
  return roles;
}

bool splitsAny(const std::vector<TensorRole>& roles) {
  return std::any_of(roles.begin(), roles.end(),
                     [](const TensorRole& r) { return r.kind != TensorRole::kWhole; });
}

int tensorAllreduces(const Sequence& layers, const std::vector<TensorRole>& roles) {
  int n = 0;
  for (const TensorRole& r : roles) {
    if (r.kind == TensorRole::kRow) ++n;
    if (r.kind == TensorRole::kBlock)
      n += dynamic_cast<const TensorSplitBlock&>(layers.layer(r.layer)).tensorAllreduces();
  }
  return n;
}

std::vector<TensorRole> planTensorSplit(const Sequence& layers, size_t begin, size_t end) {
  std::vector<TensorRole> roles = findTensorSplit(layers, begin, end);
  TANDEM_CHECK_MSG(splitsAny(roles), InvalidArgument,
                   "tensor split: layers [" << begin << ", " << end
                                            << ") hold no pair of linear layers (a linear, "
                                               "per-feature activations only, a linear) or of "
                                               "convolutions, and no attention, SwiGLU MLP or "
                                               "block of them to split (int8 weights and grouped "
                                               "convolutions do not split)");
  return roles;
}

std::string describe(const Sequence& layers, const std::vector<TensorRole>& roles) {
  static const char* const kind[] = {"whole", "column", "row", "slice", "split"};
  std::ostringstream out;
  for (size_t i = 0; i < roles.size(); ++i)
    out << (i ? ", " : "") << roles[i].layer << " " << layers.layer(roles[i].layer).type() << " "
        << kind[roles[i].kind];
  return out.str();
}

uint64_t applyTensorSplit(Sequence& layers, const std::vector<TensorRole>& roles, Group& group,
                          const std::vector<double>& shares, uint64_t first_tag) {
  TANDEM_CHECK_MSG(
      static_cast<size_t>(group.size()) == shares.size(), InvalidArgument,
      "tensor split: " << shares.size() << " shares for a group of " << group.size() << " ranks");
  const auto rank = static_cast<size_t>(group.rank());
  uint64_t tag = first_tag;
  for (size_t k = 0; k < roles.size(); ++k) {
    const size_t i = roles[k].layer;
    if (roles[k].kind == TensorRole::kBlock) {
      dynamic_cast<TensorSplitBlock&>(layers.layer(i)).splitTensor(group, shares, tag);
      continue;
    }
    if (roles[k].kind != TensorRole::kColumn) continue;
    auto& first = dynamic_cast<TensorSplittable&>(layers.layer(i));
    size_t j = k + 1;
    while (roles[j].kind != TensorRole::kRow) ++j;
    auto& second = dynamic_cast<TensorSplittable&>(layers.layer(roles[j].layer));
    const std::vector<int64_t> bounds =
        shareBounds(first.splitFeatures(TensorSplit::kColumn), shares,
                    "layer " + std::to_string(i) + " (" + layers.layer(i).type() + ")");
    TensorPart part;
    part.group = &group;
    part.begin = bounds[rank];
    part.end = bounds[rank + 1];
    part.split = TensorSplit::kColumn;
    part.tag = tag++;
    first.setTensorPart(part);
    part.split = TensorSplit::kRow;
    part.tag = tag++;
    second.setTensorPart(part);
  }
  return tag;
}

}  // namespace tandem

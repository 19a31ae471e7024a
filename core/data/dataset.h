// In-memory labelled image datasets, batching and seeded shuffling.
//
// Images stay as bytes (a 60,000-image Fashion-MNIST train set is 47 MB instead of 188 MB
// as floats) and are normalised per batch: x = (byte / 255 - mean) / stddev.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/shape.h"

namespace tandem {

struct Dataset {
  std::string name;
  Shape sample_shape;           // e.g. [1, 28, 28]
  std::vector<uint8_t> images;  // size() * sample_shape.numel() bytes
  std::vector<int32_t> labels;  // size() labels in [0, classes)
  int64_t classes = 0;
  float mean = 0.0f, stddev = 1.0f;
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr const char* kFashionMnistPackage = "dataset-fashion-mnist";

// Loads the train or test split; `limit` > 0 keeps the first `limit` samples. A missing
// file raises IoError naming the path looked at and the Debian package that provides it.
Dataset loadFashionMnist(const std::string& dir, bool train, int64_t limit = 0);

// Loads a dataset by name ("fashion-mnist"); unknown names raise InvalidArgument.
Dataset loadDataset(const std::string& name, const std::string& dir, bool train, int64_t limit = 0);

// The sample order of one epoch: identity without shuffling, else a Fisher-Yates
// permutation from (seed, epoch) that is the same on every platform.
std::vector<int64_t> epochOrder(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

// InvalidArgument for a range outside `order` or an entry in it outside the data.
void checkBatch(const Dataset& d, const std::vector<int64_t>& order, int64_t begin, int64_t count);

// Fills x (count * sample floats, normalised) and y for samples order[begin, begin+count)
// (checked by checkBatch first).
void gatherBatch(const Dataset& d, const std::vector<int64_t>& order, int64_t begin, int64_t count,
                 std::vector<float>& x, std::vector<int32_t>& y);

}  // namespace tandem

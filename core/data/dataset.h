// In-memory labelled datasets, batching and seeded shuffling.
//
// Images stay as bytes (a 60,000-image Fashion-MNIST train set is 47 MB instead of 188 MB
// as floats), normalised per batch: x = (byte / 255 - mean) / stddev; tokens (text: its
// bytes, or a tokenizer's ids) are given to the model as their ids, with one label per
// token.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/data_access.h"
#include "core/shape.h"

namespace tandem {

struct Dataset {
  std::string name;
  Shape sample_shape;           // e.g. [1, 28, 28]; [T] for tokens
  std::vector<uint8_t> images;  // size() * sample_shape.numel() bytes (not for tokens)
  std::vector<int32_t> ids;     // tokens: size() * sample_shape.numel() ids in [0, classes)
  // size() * labels_per_sample labels in [0, classes): one per image, one per token (the
  // next one) for text.
  std::vector<int32_t> labels;
  int64_t labels_per_sample = 1;
  bool tokens = false;  // samples are token ids (`ids`), not normalised pixels
  int64_t classes = 0;
  float mean = 0.0f, stddev = 1.0f;
  int64_t size() const { return static_cast<int64_t>(labels.size()) / labels_per_sample; }
  // What a model trained on it outputs per sample: [classes], or [T, classes] for tokens.
  Shape outputShape() const {
    return labels_per_sample == 1 ? Shape{classes} : Shape{labels_per_sample, classes};
  }
};

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr const char* kFashionMnistPackage = "dataset-fashion-mnist";

// Loads the train or test split; `limit` > 0 keeps the first `limit` samples. A missing
// file raises IoError naming the path looked at and the Debian package that provides it
// (under a node's rules, `access` with roots, the uniform refusal of checkDataFile).
Dataset loadFashionMnist(const std::string& dir, bool train, int64_t limit = 0,
                         const DataAccess& access = {});

// How text data becomes tokens: a language model's tokenizer (the ids of a piece of text,
// in [0, vocab)), or bytes when `encode` is empty.
struct TextTokens {
  std::function<std::vector<int32_t>(std::string_view)> encode;
  int64_t vocab = 256;
  std::string name = "bytes";  // for messages: "bytes", "the tokenizer of 'DIR'"
};

// Loads a dataset by name: "fashion-mnist" (from `dir`, empty for the Debian package's),
// or "text:PATH" (loadText; `context` is the model's sequence length, `seed` draws the
// training windows, `tokens` the model's tokenizer, if it has one); unknown names raise
// InvalidArgument. Files are read only where `access` allows (data_access.h).
Dataset loadDataset(const std::string& name, const std::string& dir, bool train, int64_t limit = 0,
                    int64_t context = 0, uint64_t seed = 0, const DataAccess& access = {},
                    const TextTokens& tokens = {});

// The sample order of one epoch: identity without shuffling, else a Fisher-Yates
// permutation from (seed, epoch) that is the same on every platform.
std::vector<int64_t> epochOrder(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

// InvalidArgument for a range outside `order` or an entry in it outside the data.
void checkBatch(const Dataset& d, const std::vector<int64_t>& order, int64_t begin, int64_t count);

// Fills x (count * sample floats: normalised pixels, or token ids) and y (count *
// labels_per_sample) for samples order[begin, begin+count) (checked by checkBatch first).
void gatherBatch(const Dataset& d, const std::vector<int64_t>& order, int64_t begin, int64_t count,
                 std::vector<float>& x, std::vector<int32_t>& y);

}  // namespace tandem

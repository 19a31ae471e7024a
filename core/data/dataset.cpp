#include "core/data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "core/data/idx.h"
#include "core/data/text.h"
#include "core/error.h"
#include "core/random.h"

namespace tandem {

Dataset loadFashionMnist(const std::string& dir, bool train, int64_t limit,
                         const DataAccess& access) {
  const std::string prefix = dir + "/" + (train ? "train" : "t10k");
  const std::string image_path = prefix + "-images-idx3-ubyte.gz";
  const std::string label_path = prefix + "-labels-idx1-ubyte.gz";
  for (const std::string& p : {image_path, label_path}) {
    if (access.roots.empty() && !std::filesystem::exists(p))
      throw IoError("Fashion-MNIST file not found: '" + p + "' (install the Debian package " +
                    kFashionMnistPackage + ", or pass the directory that holds it)");
  }
  // Both checked before either is opened; the arrays they declare are held to the node's
  // limit too (a small gzip file may unpack to gigabytes).
  const std::string images_file = checkDataFile(access, image_path, "Fashion-MNIST file");
  const std::string labels_file = checkDataFile(access, label_path, "Fashion-MNIST file");
  const auto most = static_cast<uint64_t>(access.max_file_bytes);
  IdxArray images = readIdx(images_file, most);
  IdxArray labels = readIdx(labels_file, most);
  if (images.dims.size() != 3)
    throw FormatError("'" + image_path + "': expected a rank-3 image array, got rank " +
                      std::to_string(images.dims.size()));
  if (labels.dims.size() != 1 || labels.dims[0] != images.dims[0])
    throw FormatError("'" + label_path +
                      "': " + std::to_string(labels.dims.empty() ? 0 : labels.dims[0]) +
                      " labels for " + std::to_string(images.dims[0]) + " images");
  Dataset d;
  d.name = "fashion-mnist";
  d.sample_shape = Shape{1, images.dims[1], images.dims[2]};
  d.classes = 10;
  d.mean = 0.2860f;  // the Fashion-MNIST training set's pixel statistics
  d.stddev = 0.3530f;
  int64_t n = images.dims[0];
  if (limit > 0 && limit < n) n = limit;
  const int64_t sample = d.sample_shape.numel();
  images.data.resize(static_cast<size_t>(n * sample));
  d.images = std::move(images.data);
  d.labels.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t l = labels.data[static_cast<size_t>(i)];
    if (l >= d.classes)
      throw FormatError("'" + label_path + "': label " + std::to_string(l) + " of sample " +
                        std::to_string(i) + " is outside [0, 10)");
    d.labels[static_cast<size_t>(i)] = l;
  }
  return d;
}

Dataset loadDataset(const std::string& name, const std::string& dir, bool train, int64_t limit,
                    int64_t context, uint64_t seed, const DataAccess& access,
                    const TextTokens& tokens) {
  if (name == "fashion-mnist")
    return loadFashionMnist(dir.empty() ? kFashionMnistDir : dir, train, limit, access);
  if (name.rfind("text:", 0) == 0) {
    TANDEM_CHECK_MSG(name.size() > 5, InvalidArgument, "'text:' needs a file or folder: text:PATH");
    TANDEM_CHECK_MSG(context > 0, InvalidArgument,
                     "text data needs a model whose input is [T] token ids (the context)");
    return loadText(name.substr(5), context, train, seed, limit, access, tokens);
  }
  throw InvalidArgument("unknown dataset '" + name + "' (known: fashion-mnist, text:PATH)");
}

std::vector<int64_t> epochOrder(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle) return order;
  Rng rng(combineSeeds(seed, static_cast<uint64_t>(epoch)));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

void checkBatch(const Dataset& d, const std::vector<int64_t>& order, int64_t begin, int64_t count) {
  TANDEM_CHECK_MSG(begin >= 0 && count >= 0 && begin + count <= static_cast<int64_t>(order.size()),
                   InvalidArgument,
                   "batch [" << begin << ", " << begin + count << ") of an order of "
                             << order.size() << " samples");
  for (int64_t i = begin; i < begin + count; ++i) {
    const int64_t idx = order[static_cast<size_t>(i)];
    TANDEM_CHECK_MSG(idx >= 0 && idx < d.size(), InvalidArgument,
                     "batch position " << i << " names sample " << idx << " of " << d.size());
  }
}

void gatherBatch(const Dataset& d, const std::vector<int64_t>& order, int64_t begin, int64_t count,
                 std::vector<float>& x, std::vector<int32_t>& y) {
  checkBatch(d, order, begin, count);
  const int64_t sample = d.sample_shape.numel();
  const size_t held = d.tokens ? d.ids.size() : d.images.size();
  TANDEM_CHECK_MSG(static_cast<int64_t>(held) == d.size() * sample, InvalidArgument,
                   "dataset '" << d.name << "' holds " << held << (d.tokens ? " ids" : " bytes")
                               << " for " << d.size() << " samples of " << sample);
  const int64_t per = d.labels_per_sample;
  x.resize(static_cast<size_t>(count * sample));
  y.resize(static_cast<size_t>(count * per));
  const float scale = d.tokens ? 1.0f : 1.0f / (255.0f * d.stddev);
  const float shift = d.tokens ? 0.0f : d.mean / d.stddev;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t idx = order[static_cast<size_t>(begin + i)];
    float* dst = x.data() + i * sample;
    if (d.tokens) {
      const int32_t* src = d.ids.data() + idx * sample;
      for (int64_t j = 0; j < sample; ++j) dst[j] = static_cast<float>(src[j]);
    } else {
      const uint8_t* src = d.images.data() + idx * sample;
      for (int64_t j = 0; j < sample; ++j) dst[j] = static_cast<float>(src[j]) * scale - shift;
    }
    std::copy_n(d.labels.begin() + idx * per, per, y.begin() + i * per);
  }
}

}  // namespace tandem

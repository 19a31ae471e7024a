#include "core/data/text.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "core/data/data_access.h"
#include "core/error.h"
#include "core/random.h"

namespace tandem {
namespace fs = std::filesystem;

int64_t firstNonTextByte(const std::string& bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const auto n = static_cast<int64_t>(bytes.size());
  for (int64_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c == 0) return i;
    int64_t extra = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + extra >= n) return i;  // cut short
    for (int64_t k = 1; k <= extra; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return i;
    i += extra + 1;
  }
  return -1;
}

namespace {

std::string readCorpus(const std::string& path, const DataAccess& access) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  // Without roots (this user's own run) a missing corpus is named, with the package that
  // has the default one; under a node's rules nothing is said of what the path holds.
  if (access.roots.empty() && (ec || !fs::exists(st)))
    throw IoError("text data not found: '" + path + "'" +
                  (path.rfind(kTextCorpusDir, 0) == 0
                       ? std::string(" (install the Debian package ") + kTextCorpusPackage + ")"
                       : std::string()));
  if (ec || !fs::is_directory(st)) {
    const std::string file = checkDataFile(access, path, "text data");
    std::string bytes = readDataFile(access, file, "text data");
    const int64_t bad = firstNonTextByte(bytes);
    if (bad >= 0)
      throw FormatError("'" + path + "' is not text (UTF-8 without NUL bytes): byte " +
                        std::to_string(static_cast<unsigned char>(bytes[bad])) + " at offset " +
                        std::to_string(bad));
    return bytes;
  }
  const std::string folder = checkDataFolder(access, path, "text data");
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(folder))
    if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string all;
  int64_t used = 0;
  for (const fs::path& f : files) {
    const std::string bytes =
        readDataFile(access, checkDataFile(access, f.string(), "text data"), "text data");
    if (firstNonTextByte(bytes) >= 0) continue;  // an index or other binary file beside
    all += bytes;
    ++used;
    TANDEM_CHECK_MSG(static_cast<int64_t>(all.size()) <= access.max_file_bytes, InvalidArgument,
                     "folder '" << path << "' holds more than " << access.max_file_bytes
                                << " bytes of text, this node's limit");
  }
  TANDEM_CHECK_MSG(used > 0, FormatError,
                   "folder '" << path << "' holds no text file (" << files.size()
                              << " files, none UTF-8 without NUL bytes)");
  return all;
}

}  // namespace

Dataset loadText(const std::string& path, int64_t context, bool train, uint64_t seed, int64_t limit,
                 const DataAccess& access, const TextTokens& tokens) {
  TANDEM_CHECK_MSG(context > 0, InvalidArgument,
                   "text data: the context must be positive, got " << context);
  const std::string text = readCorpus(path, access);
  const auto len = static_cast<int64_t>(text.size());
  int64_t cut = len - len / 10;
  // A tokenizer takes whole characters (bytes are tokens whatever they are).
  while (tokens.encode && cut > 0 && cut < len &&
         (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80)
    --cut;
  // (The held-out part is checked on either load, as a tokenizer's ids are no more than
  // the bytes they come from.)
  TANDEM_CHECK_MSG(len - cut >= context + 1, FormatError,
                   "'" << path << "' holds " << len << " bytes: too little for a context of "
                       << context << " (the held-out last 10% needs at least " << context + 1
                       << ")");
  const std::string_view part =
      train ? std::string_view(text).substr(0, cut) : std::string_view(text).substr(cut);
  std::vector<int32_t> ids;
  if (tokens.encode) {
    ids = tokens.encode(part);
    for (size_t i = 0; i < ids.size(); ++i)
      TANDEM_CHECK_MSG(ids[i] >= 0 && ids[i] < tokens.vocab, InvalidArgument,
                       "text data '" << path << "': " << tokens.name << " gave id " << ids[i]
                                     << " (token " << i << "), outside the model's vocab of "
                                     << tokens.vocab);
  } else {
    ids.assign(reinterpret_cast<const unsigned char*>(part.data()),
               reinterpret_cast<const unsigned char*>(part.data()) + part.size());
  }
  const auto span = static_cast<int64_t>(ids.size());
  TANDEM_CHECK_MSG(
      span >= context + 1, FormatError,
      "'" << path << "' holds " << len << " bytes: too little for a context of " << context
          << " (its " << (train ? "training first 90%" : "held-out last 10%") << " is " << span
          << " tokens of " << tokens.name << ", and needs at least " << context + 1 << ")");
  int64_t count = (span - 1) / context;
  if (limit > 0) count = std::min(count, limit);

  Dataset d;
  d.name = "text:" + path;
  d.sample_shape = Shape{context};
  d.labels_per_sample = context;
  d.tokens = true;
  d.classes = tokens.encode ? tokens.vocab : 256;
  d.ids.resize(static_cast<size_t>(count * context));
  d.labels.resize(static_cast<size_t>(count * context));
  Rng rng(seed);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t start =
        train ? static_cast<int64_t>(rng.below(static_cast<uint64_t>(span - context)))
              : i * context;
    std::copy_n(ids.begin() + start, context, d.ids.begin() + i * context);
    std::copy_n(ids.begin() + start + 1, context, d.labels.begin() + i * context);
  }
  return d;
}

}  // namespace tandem

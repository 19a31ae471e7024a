// Text as a language-modelling dataset: byte-level tokens (vocab 256, no tokenizer), in
// windows of the model's context length, each token labelled with the byte after it.
#pragma once

#include <cstdint>
#include <string>

#include "core/data/data_access.h"
#include "core/data/dataset.h"

namespace tandem {

inline constexpr const char* kTextCorpusDir = "/usr/share/games/fortunes";
inline constexpr const char* kTextCorpusPackage = "fortunes";

// `path` is a file or a folder. A folder's regular files are read in name order (links
// are not followed) and those that are not text are skipped; a file given by name must be
// text. Text is UTF-8 without NUL bytes; anything else raises FormatError naming the file
// and the offset. The bytes, concatenated, split into training (the first 90%) and
// held-out (the last 10%) data. Training samples are (len - 1) / context windows at
// starts drawn uniformly from `seed`; held-out samples are the consecutive windows, so an
// evaluation is the same for every seed. `limit` > 0 keeps the first `limit` windows.
// Every file is read only if `access` allows it (a node's rules: checkDataFile).
Dataset loadText(const std::string& path, int64_t context, bool train, uint64_t seed,
                 int64_t limit = 0, const DataAccess& access = {});

// The offset of the first byte that makes `bytes` not text (a NUL, or not UTF-8), or -1.
int64_t firstNonTextByte(const std::string& bytes);

}  // namespace tandem

// Text as a language-modelling dataset: its bytes as tokens (vocab 256), or the ids a
// model's tokenizer gives it, in windows of the model's context length, each token
// labelled with the one after it.
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
// held-out (the last 10%) text (for a tokenizer, the cut moved back to the start of a
// UTF-8 character); each part becomes tokens (`tokens`: its bytes, or a tokenizer's ids of that
// part). Training samples are (n - 1) / context windows of its n tokens at starts drawn uniformly
// from `seed`; held-out samples are the consecutive windows, so an evaluation is the same for every
// seed. `limit` > 0 keeps the first `limit` windows. Every file is read only if `access` allows it
// (a node's rules: checkDataFile). A tokenizer's id outside [0, tokens.vocab) raises
// InvalidArgument naming it.
Dataset loadText(const std::string& path, int64_t context, bool train, uint64_t seed,
                 int64_t limit = 0, const DataAccess& access = {}, const TextTokens& tokens = {});

// The offset of the first byte that makes `bytes` not text (a NUL, or not UTF-8), or -1.
int64_t firstNonTextByte(const std::string& bytes);

}  // namespace tandem

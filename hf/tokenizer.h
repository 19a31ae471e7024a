// Byte-level BPE tokenizers from Hugging Face's tokenizer.json, as GPT-2, Llama 3, Qwen2 and
// SmolLM ship them:
//   normalizer     null or NFC
//   pre_tokenizer  ByteLevel (GPT-2's pattern when use_regex; add_prefix_space), Split
//                  (a regex, behavior Isolated), or a Sequence of them
//   model          BPE over byte-level symbols: vocab, merges ("a b" or ["a", "b"]),
//                  ignore_merges; no byte fallback, no subword prefix or suffix
//   added_tokens   matched in the text before anything else (longest first), special or
//                  not, with lstrip / rstrip
//   decoder        ByteLevel (an added token decodes to its content as it is)
//   post_processor TemplateProcessing's single template (e.g. Llama 3's BOS), ByteLevel,
//                  or null
// Regexes run on ICU (Unicode properties, lookahead); anything else in the file is refused
// naming its place, never a silently different tokenization. (SentencePiece-style
// tokenizers — Metaspace, byte_fallback: Llama 2, TinyLlama — are among the refused.)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tandem::hf {

class Tokenizer {
 public:
  // FormatError "<label>: <where>: ..." for a file that is not a tokenizer.json,
  // Unsupported naming the component for one this tokenizer does not implement.
  static Tokenizer parse(std::string_view json, const std::string& label);
  static Tokenizer load(const std::string& path);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Token ids of UTF-8 text (added tokens in it recognised); with add_special, the post
  // processor's template around them (Llama 3's BOS). Text that is not UTF-8 has its
  // invalid bytes replaced by U+FFFD, as a str decoded with errors="replace".
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const;
  // The text of ids (special tokens left out with skip_special); InvalidArgument naming
  // an id outside the vocabulary. Byte sequences that are not UTF-8 (a character cut
  // between tokens) come back as they are.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // One past the largest id.
  int32_t vocabSize() const;
  // An added token's id by its content.
  std::optional<int32_t> tokenId(std::string_view content) const;
  bool isSpecial(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::hf

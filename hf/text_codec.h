// What a language model's token ids mean as text: bytes (tandem's byte models: id = byte),
// or the byte-level BPE of the tokenizer.json the model came with (tokenizer.h). A model
// imported from a Hugging Face folder keeps the folder's tokenizer.json in its model file
// (metadata "tokenizer"), so `tandem generate`, `tandem serve` and a job's coordinator
// tokenize as the folder does, and text data to train and evaluate on becomes its
// tokens; every other model reads and writes bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/dataset.h"
#include "core/model.h"
#include "core/model_file.h"
#include "hf/tokenizer.h"

namespace tandem::hf {

class TextCodec {
 public:
  TextCodec() = default;  // bytes
  explicit TextCodec(std::shared_ptr<const Tokenizer> tokenizer)
      : tokenizer_(std::move(tokenizer)) {}
  // The model file's tokenizer (metadata "tokenizer"), else bytes. FormatError if the
  // stored tokenizer.json does not parse; InvalidArgument if its ids do not fit the
  // model's `vocab` (its head's width; 0: not checked).
  static TextCodec forModel(const ModelFile& file, int64_t vocab = 0);

  // A prompt's ids: its bytes, or its BPE tokens with the template's special tokens
  // (Llama 3's BOS) around them.
  std::vector<int32_t> encode(std::string_view text) const;
  // A corpus's ids (text data to train or evaluate on): its bytes, or its BPE tokens
  // without the template's special tokens.
  std::vector<int32_t> encodeText(std::string_view text) const;
  // One generated token's text: its byte, or its BPE bytes (possibly part of a UTF-8
  // character: tokens decode one by one to what their sequence decodes to); nothing for a
  // special token or an id beyond the tokenizer (a padded head's rows).
  std::string tokenText(int32_t id) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  bool isBytes() const { return tokenizer_ == nullptr; }
  // The ids that end a generated text (the model file's metadata "eos_token_ids", from a
  // Hugging Face folder's eos_token_id): a server's answer stops at one, as at a stop
  // string. None for tandem's byte models.
  bool ends(int32_t id) const;
  const std::vector<int32_t>& endTokens() const { return end_tokens_; }
  void setEndTokens(std::vector<int32_t> ids) { end_tokens_ = std::move(ids); }

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::vector<int32_t> end_tokens_;
};

// How text data `data` becomes tokens for `model` (loadText): for text data (text:PATH)
// and a language model ([T] ids in, [T, V] logits out) whose model file `file` keeps a
// tokenizer, that tokenizer's ids (encodeText), named in messages as `name`'s; otherwise
// bytes (an empty encoder). InvalidArgument as forModel, when its ids do not fit V.
TextTokens textTokensFor(const ModelFile& file, const Model& model, const std::string& data,
                         const std::string& name);

}  // namespace tandem::hf

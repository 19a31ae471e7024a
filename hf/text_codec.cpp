#include "hf/text_codec.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace tandem::hf {

namespace {

// The model file's "eos_token_ids" (none when absent); FormatError if it is not a list of
// ids in [0, vocab) (vocab 0: not checked).
std::vector<int32_t> endTokensOf(const ModelFile& file, int64_t vocab) {
  const auto it = file.metadata.find("eos_token_ids");
  if (it == file.metadata.end()) return {};
  const auto* ids = std::get_if<std::vector<int64_t>>(&it->second);
  TANDEM_CHECK_MSG(
      ids != nullptr, FormatError,
      "model '" << file.spec.name << "': metadata 'eos_token_ids' is not a list of ids");
  std::vector<int32_t> out;
  for (const int64_t id : *ids) {
    TANDEM_CHECK_MSG(
        id >= 0 && id <= std::numeric_limits<int32_t>::max() && (vocab == 0 || id < vocab),
        FormatError,
        "model '" << file.spec.name << "': end-of-text id " << id << " is outside its vocab of "
                  << vocab);
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

}  // namespace

bool TextCodec::ends(int32_t id) const {
  return std::find(end_tokens_.begin(), end_tokens_.end(), id) != end_tokens_.end();
}

TextCodec TextCodec::forModel(const ModelFile& file, int64_t vocab) {
  TextCodec bytes;
  bytes.setEndTokens(endTokensOf(file, vocab));
  const auto it = file.metadata.find("tokenizer");
  if (it == file.metadata.end()) return bytes;
  const auto* json = std::get_if<std::string>(&it->second);
  TANDEM_CHECK_MSG(json != nullptr, FormatError,
                   "model '" << file.spec.name << "': metadata 'tokenizer' is not text");
  auto tokenizer = std::make_shared<const Tokenizer>(
      Tokenizer::parse(*json, "model '" + file.spec.name + "' tokenizer"));
  TANDEM_CHECK_MSG(vocab == 0 || tokenizer->vocabSize() <= vocab, InvalidArgument,
                   "model '" << file.spec.name << "': its tokenizer has " << tokenizer->vocabSize()
                             << " tokens, its output " << vocab);
  TextCodec codec(std::move(tokenizer));
  codec.setEndTokens(bytes.endTokens());
  return codec;
}

std::vector<int32_t> TextCodec::encode(std::string_view text) const {
  if (tokenizer_) return tokenizer_->encode(text, true);
  return {reinterpret_cast<const unsigned char*>(text.data()),
          reinterpret_cast<const unsigned char*>(text.data()) + text.size()};
}

std::vector<int32_t> TextCodec::encodeText(std::string_view text) const {
  if (tokenizer_) return tokenizer_->encode(text, false);
  return encode(text);
}

std::string TextCodec::tokenText(int32_t id) const {
  if (tokenizer_) {  // a head wider than the tokenizer (padded, as Qwen2's) has rows of no text
    if (id >= tokenizer_->vocabSize()) return "";
    return tokenizer_->decode({id}, true);
  }
  TANDEM_CHECK_MSG(id >= 0 && id < 256, InvalidArgument,
                   "token " << id << " is no byte (a byte model's tokens are 0..255)");
  return std::string(1, static_cast<char>(id));
}

std::string TextCodec::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += tokenText(id);
  return out;
}

TextTokens textTokensFor(const ModelFile& file, const Model& model, const std::string& data,
                         const std::string& name) {
  const Shape in = model.inputShape(), out = model.outputShape();
  if (data.rfind("text:", 0) != 0 || in.rank() != 1 || out.rank() != 2) return {};
  const TextCodec codec = TextCodec::forModel(file, out[1]);
  if (codec.isBytes()) return {};
  TextTokens t;
  t.encode = [codec](std::string_view text) { return codec.encodeText(text); };
  t.vocab = out[1];
  t.name = "the tokenizer of '" + name + "'";
  return t;
}

}  // namespace tandem::hf

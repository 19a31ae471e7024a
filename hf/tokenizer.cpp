#include "hf/tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"

namespace tandem::hf {
namespace {

using Json = nlohmann::json;

// GPT-2's pre-tokenizer pattern (ByteLevel with use_regex).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

[[noreturn]] void bad(const std::string& label, const std::string& where, const std::string& what) {
  throw FormatError(label + ": " + where + ": " + what);
}

[[noreturn]] void unsupported(const std::string& label, const std::string& where,
                              const std::string& what) {
  throw Unsupported(label + ": " + where + ": " + what);
}

std::string typeOf(const Json& j, const std::string& label, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    bad(label, where, "has no 'type'");
  return j["type"].get<std::string>();
}

// The UTF-8 of one code point.
std::string utf8(UChar32 c) {
  std::string out;
  icu::UnicodeString(c).toUTF8String(out);
  return out;
}

// GPT-2's bytes_to_unicode: every byte as a printable code point (the printable ones as
// themselves, the rest from 256 on).
struct ByteMap {
  std::string symbol[256];
  std::unordered_map<UChar32, uint8_t> byte_of;
  ByteMap() {
    std::vector<int> printable;
    for (int b = '!'; b <= '~'; ++b) printable.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b) printable.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b) printable.push_back(b);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool kept = std::find(printable.begin(), printable.end(), b) != printable.end();
      const UChar32 c = kept ? b : next++;
      symbol[b] = utf8(c);
      byte_of[c] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& byteMap() {
  static const ByteMap map;
  return map;
}

// One pre-tokenizer step over raw text pieces.
struct Step {
  std::unique_ptr<icu::RegexPattern> pattern;  // split, Isolated
  bool prefix_space = false;                   // ByteLevel's add_prefix_space
};

std::unique_ptr<icu::RegexPattern> compile(const std::string& pattern, bool literal,
                                           const std::string& label, const std::string& where) {
  UErrorCode status = U_ZERO_ERROR;
  UParseError pe{};
  std::unique_ptr<icu::RegexPattern> p(
      icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern),
                                 literal ? static_cast<uint32_t>(UREGEX_LITERAL) : 0u, pe, status));
  if (U_FAILURE(status))
    bad(label, where,
        "pattern " + Json(pattern).dump() + " does not compile (" + u_errorName(status) +
            " at offset " + std::to_string(pe.offset) + ")");
  return p;
}

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false;
};

bool isSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

}  // namespace

struct Tokenizer::Impl {
  std::string label;
  bool nfc = false;
  bool byte_level = false;  // a ByteLevel pre-tokenizer (the last step)
  std::vector<Step> steps;
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> token_of;               // id -> token (vocab and added)
  std::unordered_map<std::string, int32_t> ranks;  // "a b" -> merge rank
  bool ignore_merges = false;
  std::optional<int32_t> unk;
  std::vector<AddedToken> added;  // longest first
  std::vector<bool> special;      // by id
  std::vector<bool> is_added;     // by id: decoded as its content, not through the bytes
  // The post processor's single template: ids before and after the sequence.
  std::vector<int32_t> before, after;

  void parseModel(const Json& m);
  void parsePreTokenizer(const Json& p, const std::string& where, bool last);
  void parsePostProcessor(const Json& p);
  void splitPieces(const Step& step, std::vector<std::string>& pieces) const;
  void encodeSegment(std::string_view text, std::vector<int32_t>& out) const;
  void bpe(const std::string& word, std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::parseModel(const Json& m) {
  if (typeOf(m, label, "model") != "BPE")
    unsupported(label, "model", "type '" + m["type"].get<std::string>() + "' (only BPE)");
  if (m.contains("byte_fallback") && m["byte_fallback"] == true)
    unsupported(label, "model", "byte_fallback (a SentencePiece-style tokenizer; byte-level only)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(key) && !m[key].is_null() && m[key] != "")
      unsupported(label, "model", std::string(key) + " " + m[key].dump());
  if (!m.contains("vocab") || !m["vocab"].is_object()) bad(label, "model", "has no 'vocab' object");
  for (const auto& [token, id] : m["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      bad(label, "model.vocab", "token " + Json(token).dump() + " has id " + id.dump());
    vocab[token] = id.get<int32_t>();
  }
  if (!m.contains("merges") || !m["merges"].is_array()) bad(label, "model", "has no 'merges' list");
  int32_t rank = 0;
  for (const Json& merge : m["merges"]) {
    std::string a, b;
    if (merge.is_string()) {
      const auto s = merge.get<std::string>();
      const auto space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == s.size())
        bad(label, "model.merges", "merge " + merge.dump() + " is not \"a b\"");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      a = merge[0].get<std::string>();
      b = merge[1].get<std::string>();
    } else {
      bad(label, "model.merges", "merge " + merge.dump() + " is not \"a b\" or [\"a\", \"b\"]");
    }
    ranks.emplace(a + " " + b, rank++);
  }
  ignore_merges = m.value("ignore_merges", false);
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    const auto it = vocab.find(m["unk_token"].get<std::string>());
    if (it == vocab.end()) bad(label, "model.unk_token", "is not in the vocabulary");
    unk = it->second;
  }
}

void Tokenizer::Impl::parsePreTokenizer(const Json& p, const std::string& where, bool last) {
  const std::string type = typeOf(p, label, where);
  if (type == "Sequence") {
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
      bad(label, where, "a Sequence without 'pretokenizers'");
    const Json& list = p["pretokenizers"];
    for (size_t i = 0; i < list.size(); ++i)
      parsePreTokenizer(list[i], where + ".pretokenizers[" + std::to_string(i) + "]",
                        last && i + 1 == list.size());
  } else if (type == "Split") {
    const std::string behavior = p.value("behavior", "");
    if (behavior != "Isolated")
      unsupported(label, where, "Split behavior '" + behavior + "' (only Isolated)");
    if (p.value("invert", false)) unsupported(label, where, "an inverted Split");
    const Json& pattern = p.contains("pattern") ? p["pattern"] : Json();
    const bool regex = pattern.contains("Regex") && pattern["Regex"].is_string();
    if (!regex && !(pattern.contains("String") && pattern["String"].is_string()))
      bad(label, where, "Split has no Regex or String pattern");
    steps.push_back(
        {compile(pattern[regex ? "Regex" : "String"].get<std::string>(), !regex, label, where),
         false});
  } else if (type == "ByteLevel") {
    if (!last) unsupported(label, where, "ByteLevel before other pre-tokenizers");
    Step step;
    if (p.value("use_regex", true)) step.pattern = compile(kGpt2Pattern, false, label, where);
    step.prefix_space = p.value("add_prefix_space", false);
    steps.push_back(std::move(step));
    byte_level = true;
  } else {
    unsupported(label, where, "type '" + type + "' (ByteLevel, Split and Sequence are)");
  }
}

void Tokenizer::Impl::parsePostProcessor(const Json& p) {
  if (p.is_null()) return;
  const std::string type = typeOf(p, label, "post_processor");
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const Json& each : p.value("processors", Json::array())) parsePostProcessor(each);
    return;
  }
  if (type != "TemplateProcessing")
    unsupported(label, "post_processor", "type '" + type + "' (TemplateProcessing, ByteLevel)");
  bool seen_sequence = false;
  for (const Json& item : p.value("single", Json::array())) {
    if (item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id"))
      bad(label, "post_processor.single", "item " + item.dump() + " is neither");
    const auto name = item["SpecialToken"]["id"].get<std::string>();
    const Json& special = p.value("special_tokens", Json::object());
    if (!special.contains(name) || !special[name].contains("ids"))
      bad(label, "post_processor.special_tokens", "has no '" + name + "'");
    for (const Json& id : special[name]["ids"])
      (seen_sequence ? after : before).push_back(id.get<int32_t>());
  }
}

Tokenizer Tokenizer::parse(std::string_view json, const std::string& label) {
  const Json root = Json::parse(json, nullptr, false);
  if (root.is_discarded() || !root.is_object()) throw FormatError(label + ": not a JSON object");
  auto impl = std::make_unique<Impl>();
  impl->label = label;
  if (!root.contains("model")) bad(label, "model", "is missing");
  impl->parseModel(root["model"]);
  const Json& norm = root.value("normalizer", Json());
  if (!norm.is_null()) {
    const std::string type = typeOf(norm, label, "normalizer");
    if (type != "NFC") unsupported(label, "normalizer", "type '" + type + "' (only NFC)");
    impl->nfc = true;
  }
  const Json& pre = root.value("pre_tokenizer", Json());
  if (pre.is_null()) unsupported(label, "pre_tokenizer", "none: not a byte-level tokenizer");
  impl->parsePreTokenizer(pre, "pre_tokenizer", true);
  if (!impl->byte_level)
    unsupported(label, "pre_tokenizer", "no ByteLevel step: not a byte-level tokenizer");
  if (!(root.value("decoder", Json()).is_object() &&
        typeOf(root["decoder"], label, "decoder") == "ByteLevel"))
    unsupported(label, "decoder", "not ByteLevel: not a byte-level tokenizer");
  int32_t size = 0;
  for (const auto& [token, id] : impl->vocab) size = std::max(size, id + 1);
  for (const Json& t : root.value("added_tokens", Json::array())) {
    if (!t.contains("id") || !t.contains("content") || !t["content"].is_string() ||
        !t["id"].is_number_integer() || t["content"].get<std::string>().empty())
      bad(label, "added_tokens", "entry " + t.dump() + " has no id and content");
    AddedToken a{t["content"].get<std::string>(), t["id"].get<int32_t>(), t.value("special", false),
                 t.value("lstrip", false), t.value("rstrip", false)};
    if (a.id < 0) bad(label, "added_tokens", "entry " + t.dump() + " has a negative id");
    size = std::max(size, a.id + 1);
    impl->added.push_back(a);
  }
  std::stable_sort(
      impl->added.begin(), impl->added.end(),
      [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  impl->token_of.assign(static_cast<size_t>(size), "");
  impl->special.assign(static_cast<size_t>(size), false);
  impl->is_added.assign(static_cast<size_t>(size), false);
  for (const auto& [token, id] : impl->vocab) impl->token_of[static_cast<size_t>(id)] = token;
  for (const AddedToken& a : impl->added) {
    impl->token_of[static_cast<size_t>(a.id)] = a.content;
    impl->special[static_cast<size_t>(a.id)] = a.special;
    impl->is_added[static_cast<size_t>(a.id)] = true;
  }
  impl->parsePostProcessor(root.value("post_processor", Json()));
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::string& path) {
  return parse(readFile(path, "tokenizer"), path);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

int32_t Tokenizer::vocabSize() const { return static_cast<int32_t>(impl_->token_of.size()); }

std::optional<int32_t> Tokenizer::tokenId(std::string_view content) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == content) return a.id;
  const auto it = impl_->vocab.find(std::string(content));
  if (it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::isSpecial(int32_t id) const {
  return id >= 0 && id < vocabSize() && impl_->special[static_cast<size_t>(id)];
}

// Isolated: each match a piece, and each stretch between matches.
void Tokenizer::Impl::splitPieces(const Step& step, std::vector<std::string>& pieces) const {
  std::vector<std::string> out;
  for (const std::string& piece : pieces) {
    const icu::UnicodeString text = icu::UnicodeString::fromUTF8(piece);
    UErrorCode status = U_ZERO_ERROR;
    std::unique_ptr<icu::RegexMatcher> m(step.pattern->matcher(text, status));
    int32_t at = 0;
    const auto emit = [&](int32_t begin, int32_t end) {
      if (end <= begin) return;
      std::string s;
      text.tempSubStringBetween(begin, end).toUTF8String(s);
      out.push_back(std::move(s));
    };
    while (U_SUCCESS(status) && m->find(status)) {
      const int32_t begin = m->start(status), end = m->end(status);
      if (U_FAILURE(status)) break;
      if (end == begin) continue;  // an empty match splits nothing
      emit(at, begin);
      emit(begin, end);
      at = end;
    }
    TANDEM_CHECK_MSG(
        U_SUCCESS(status), InvalidArgument,
        label << ": a pre-tokenizer pattern failed on the text (" << u_errorName(status) << ")");
    emit(at, text.length());
  }
  pieces = std::move(out);
}

// GPT-2's BPE: merge the adjacent pair of lowest rank, every occurrence left to right,
// until no pair is a merge.
void Tokenizer::Impl::bpe(const std::string& word, std::vector<int32_t>& out) const {
  if (ignore_merges)
    if (const auto it = vocab.find(word); it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  std::vector<std::string> symbols;
  const icu::UnicodeString chars = icu::UnicodeString::fromUTF8(word);
  for (int32_t i = 0; i < chars.length(); i = chars.moveIndex32(i, 1))
    symbols.push_back(utf8(chars.char32At(i)));
  while (symbols.size() > 1) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = ranks.find(symbols[i] + " " + symbols[i + 1]);
      if (it != ranks.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == INT32_MAX) break;
    const std::string first = symbols[at], second = symbols[at + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (i + 1 < symbols.size() && symbols[i] == first && symbols[i + 1] == second) {
        merged.push_back(first + second);
        ++i;
      } else {
        merged.push_back(symbols[i]);
      }
    }
    symbols = std::move(merged);
  }
  for (const std::string& s : symbols) {
    const auto it = vocab.find(s);
    if (it != vocab.end()) {
      out.push_back(it->second);
    } else {
      TANDEM_CHECK_MSG(
          unk.has_value(), InvalidArgument,
          label << ": symbol '" << s << "' is not in the vocabulary (and no unk_token)");
      out.push_back(*unk);
    }
  }
}

// Text with no added token in it: normalised, pre-tokenised, each piece's bytes as
// byte-level symbols, then BPE.
void Tokenizer::Impl::encodeSegment(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normal(text);
  if (nfc) {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
    icu::UnicodeString u = n->normalize(icu::UnicodeString::fromUTF8(normal), status);
    TANDEM_CHECK_MSG(U_SUCCESS(status), InvalidArgument,
                     label << ": NFC failed: " << u_errorName(status));
    normal.clear();
    u.toUTF8String(normal);
  } else {
    // Invalid UTF-8 as U+FFFD, as the patterns see it.
    std::string valid;
    icu::UnicodeString::fromUTF8(normal).toUTF8String(valid);
    normal = std::move(valid);
  }
  std::vector<std::string> pieces = {normal};
  for (const Step& step : steps) {
    if (step.prefix_space)
      for (std::string& p : pieces)
        if (!p.empty() && p.front() != ' ') p.insert(p.begin(), ' ');
    if (step.pattern) splitPieces(step, pieces);
  }
  const ByteMap& map = byteMap();
  for (const std::string& piece : pieces) {
    std::string word;
    for (unsigned char b : piece) word += map.symbol[b];
    bpe(word, out);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> out;
  if (add_special) out = impl_->before;
  size_t segment = 0, at = 0;
  while (at < text.size()) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : impl_->added)
      if (text.compare(at, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    if (hit == nullptr) {
      ++at;
      continue;
    }
    size_t end = at;
    if (hit->lstrip)
      while (end > segment && isSpace(text[end - 1])) --end;
    impl_->encodeSegment(text.substr(segment, end - segment), out);
    out.push_back(hit->id);
    at += hit->content.size();
    if (hit->rstrip)
      while (at < text.size() && isSpace(text[at])) ++at;
    segment = at;
  }
  impl_->encodeSegment(text.substr(segment), out);
  if (add_special) out.insert(out.end(), impl_->after.begin(), impl_->after.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  const ByteMap& map = byteMap();
  std::string out;
  for (int32_t id : ids) {
    TANDEM_CHECK_MSG(id >= 0 && id < vocabSize(), InvalidArgument,
                     "token id " << id << " is outside the vocabulary [0, " << vocabSize() << ")");
    if (skip_special && impl_->special[static_cast<size_t>(id)]) continue;
    if (impl_->is_added[static_cast<size_t>(id)]) {  // its text as it is (transformers')
      out += impl_->token_of[static_cast<size_t>(id)];
      continue;
    }
    const icu::UnicodeString chars =
        icu::UnicodeString::fromUTF8(impl_->token_of[static_cast<size_t>(id)]);
    for (int32_t i = 0; i < chars.length(); i = chars.moveIndex32(i, 1)) {
      const UChar32 c = chars.char32At(i);
      const auto it = map.byte_of.find(c);
      if (it != map.byte_of.end())
        out += static_cast<char>(it->second);
      else
        out += utf8(c);
    }
  }
  return out;
}

}  // namespace tandem::hf

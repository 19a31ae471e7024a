// Byte-level BPE tokenizers (hf/tokenizer.h) against transformers.js's on the fixtures of
// scripts/tokenizer-fixtures — GPT-2's, Llama 3's and Qwen2's forms of tokenizer.json — over
// ASCII, accents, CJK, emoji, whitespace runs, digits, contractions and special tokens:
// ids with and without the post processor's special tokens, and the decodings, equal to
// the reference's committed output (expected-NAME.json; tokenizer_reference_test.cpp runs
// the reference itself). Then what the reference cannot say: every byte round-trips, ids
// outside the vocabulary and unsupported files are named.
#include "hf/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file.h"
#include "hf/text_codec.h"
#include "tests/hf/tokenizer_expect.h"
#include "tests/test_util.h"

namespace tandem::hf {
namespace {

const std::string kTokenizerFixtures = TANDEM_SOURCE_DIR "/tests/data/tokenizer/";

class TokenizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerTest, EncodesAndDecodesAsTransformersJsDid) {
  const Tokenizer t = Tokenizer::load(kTokenizerFixtures + GetParam() + ".json");
  const auto reference = nlohmann::json::parse(
      readFile(kTokenizerFixtures + "expected-" + GetParam() + ".json", "fixture"));
  ASSERT_EQ(reference.size(),
            nlohmann::json::parse(readFile(kTokenizerFixtures + "texts.json", "fixture")).size());
  expectLikeReference(t, reference);
}

// Every text that NFC leaves alone, and every byte string, comes back from decode(encode).
TEST_P(TokenizerTest, DecodingGivesBackTheText) {
  const Tokenizer t = Tokenizer::load(kTokenizerFixtures + GetParam() + ".json");
  for (const auto& text :
       nlohmann::json::parse(readFile(kTokenizerFixtures + "texts.json", "fixture"))) {
    const auto s = text.get<std::string>();
    if (GetParam() == "qwen2" && s.find("e\xcc\x81") != std::string::npos) continue;  // NFC
    EXPECT_EQ(t.decode(t.encode(s)), s);
  }
  std::string bytes;
  for (int b = 1; b < 128; ++b) bytes += static_cast<char>(b);
  EXPECT_EQ(t.decode(t.encode(bytes)), bytes);
  // Invalid UTF-8 is read as U+FFFD, as Python's errors="replace" reads it.
  EXPECT_EQ(t.decode(t.encode("a\xff"
                              "b")),
            "a\xef\xbf\xbd"
            "b");
  testing::expectThrowWith<InvalidArgument>([&] { t.decode({t.vocabSize()}); },
                                            {"token id", "outside the vocabulary"});
}

INSTANTIATE_TEST_SUITE_P(Forms, TokenizerTest, ::testing::Values("gpt2", "llama3", "qwen2"));

TEST(TokenizerFileTest, SpecialTokensAndTheTemplate) {
  const Tokenizer t = Tokenizer::load(kTokenizerFixtures + "llama3.json");
  const auto bos = t.tokenId("<|begin_of_text|>");
  ASSERT_TRUE(bos.has_value());
  EXPECT_TRUE(t.isSpecial(*bos));
  EXPECT_FALSE(t.isSpecial(72));
  EXPECT_EQ(t.encode("Hi", true).front(), *bos);
  EXPECT_EQ(t.encode("<|eot_id|>"), std::vector<int32_t>{*t.tokenId("<|eot_id|>")});
  EXPECT_EQ(t.vocabSize(), *t.tokenId("<|eot_id|>") + 1);
}

TEST(TokenizerFileTest, WhatItDoesNotImplementIsNamed) {
  const auto base = nlohmann::json::parse(readFile(kTokenizerFixtures + "gpt2.json", "fixture"));
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit,
                           const std::vector<std::string>& parts) {
    nlohmann::json j = base;
    edit(j);
    testing::expectThrowWith<Unsupported>([&] { Tokenizer::parse(j.dump(), "t.json"); }, parts);
  };
  refused(
      [](auto& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}};
      },
      {"t.json: pre_tokenizer", "'Metaspace'"});
  refused([](auto& j) { j["model"]["byte_fallback"] = true; }, {"byte_fallback"});
  refused([](auto& j) { j["model"]["type"] = "WordPiece"; }, {"model", "'WordPiece' (only BPE)"});
  refused(
      [](auto& j) {
        j["normalizer"] = {{"type", "Lowercase"}};
      },
      {"normalizer", "'Lowercase'"});
  refused(
      [](auto& j) {
        j["post_processor"] = {{"type", "RobertaProcessing"}};
      },
      {"post_processor", "'RobertaProcessing'"});
  refused([](auto& j) { j["decoder"] = {{"type", "Metaspace"}}; }, {"decoder", "not ByteLevel"});
  testing::expectThrowWith<FormatError>([] { Tokenizer::parse("[]", "t.json"); },
                                        {"t.json: not a JSON object"});
  nlohmann::json j = base;
  j["model"]["merges"][0] = "nospace";
  testing::expectThrowWith<FormatError>([&] { Tokenizer::parse(j.dump(), "t.json"); },
                                        {"model.merges", "\"nospace\""});
  j = base;
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Isolated"}};
  testing::expectThrowWith<Unsupported>([&] { Tokenizer::parse(j.dump(), "t.json"); },
                                        {"pre_tokenizer", "no ByteLevel step"});
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  testing::expectThrowWith<FormatError>([&] { Tokenizer::parse(j.dump(), "t.json"); },
                                        {"pre_tokenizer.pretokenizers[0]", "does not compile"});
}

// The text side of generation: bytes for a model without a tokenizer; a model file's
// stored tokenizer.json otherwise, with the template's BOS, tokens written one by one as
// their bytes (joining to the whole decoding), special tokens and a padded head's rows as
// nothing, and a tokenizer wider than the model refused.
TEST(TextCodecTest, BytesOrTheModelsTokenizer) {
  const TextCodec bytes = TextCodec::forModel(ModelFile{});
  EXPECT_TRUE(bytes.isBytes());
  EXPECT_EQ(bytes.encode("Hi\xff"), (std::vector<int32_t>{'H', 'i', 255}));
  EXPECT_EQ(bytes.decode({'H', 'i'}), "Hi");
  testing::expectThrowWith<InvalidArgument>([&] { bytes.tokenText(256); }, {"no byte"});

  ModelFile file;
  file.spec.name = "m";
  file.metadata["tokenizer"] = readFile(kTokenizerFixtures + "llama3.json", "fixture");
  const TextCodec codec = TextCodec::forModel(file, 700);
  ASSERT_FALSE(codec.isBytes());
  const Tokenizer t = Tokenizer::load(kTokenizerFixtures + "llama3.json");
  const std::string text = "Schöne Grüße 🙂 und 12345";
  const std::vector<int32_t> ids = codec.encode(text);
  EXPECT_EQ(ids, t.encode(text, true));
  std::string joined;
  for (int32_t id : ids) joined += codec.tokenText(id);
  EXPECT_EQ(joined, text);  // the BOS as nothing
  EXPECT_EQ(codec.decode(ids), text);
  EXPECT_EQ(codec.tokenText(699), "");  // beyond the tokenizer's 659: a padded head's row
  testing::expectThrowWith<InvalidArgument>([&] { TextCodec::forModel(file, 600); },
                                            {"its tokenizer has 659 tokens, its output 600"});
  file.metadata["tokenizer"] = int64_t{3};
  testing::expectThrowWith<FormatError>([&] { TextCodec::forModel(file); },
                                        {"metadata 'tokenizer' is not text"});
}

}  // namespace
}  // namespace tandem::hf

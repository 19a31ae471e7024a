// tandem's byte-level BPE tokenizers against transformers.js's run now: the reference
// (@huggingface/tokenizers from npm, which scripts/setup --with-test-clients installs into
// the build tree) tokenizes the fixtures' texts with each of scripts/tokenizer-fixtures'
// tokenizer.json files through tests/hf/tokenizer_reference.mjs, offline, and tandem's
// encodings and decodings must equal its. (tokenizer_test.cpp checks the same against its
// committed output without Node; this one shows the committed output is still the
// reference's.) Labelled integration: it starts Node.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/hf/tokenizer_expect.h"

namespace tandem::hf {
namespace {

const std::string kFixtures = TANDEM_SOURCE_DIR "/tests/data/tokenizer/";
const std::string kNpm = TANDEM_NPM_DIR;

class TokenizerReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerReferenceTest, EncodesAndDecodesAsTransformersJsDoesNow) {
  if (!std::filesystem::exists(kNpm + "/node_modules/@huggingface/tokenizers/package.json"))
    GTEST_SKIP() << "transformers.js's tokenizers are not in " << kNpm
                 << ": scripts/setup --with-test-clients installs them";
  const std::string command = "node " TANDEM_SOURCE_DIR "/tests/hf/tokenizer_reference.mjs " +
                              kNpm + " " + kFixtures + GetParam() + ".json " + kFixtures +
                              "texts.json";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << command << "\n" << out;
  const nlohmann::json reference = nlohmann::json::parse(out);
  ASSERT_EQ(reference.size(), 19u);
  expectLikeReference(Tokenizer::load(kFixtures + GetParam() + ".json"), reference);
}

INSTANTIATE_TEST_SUITE_P(Forms, TokenizerReferenceTest,
                         ::testing::Values("gpt2", "llama3", "qwen2"));

}  // namespace
}  // namespace tandem::hf

// Incremental decoding and generation: decoding a sequence gives forward's rows; a
// key/value cache gives the same tokens, and the same logits to 1e-5 (the products run in
// other shapes, so the BLAS rounds them differently), as recomputing the whole prefix;
// sampling is seeded and bounded by top-k; bad requests are named.
#include "core/generate.h"

#include <gtest/gtest.h>

#include <set>

#include "backends/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/model_spec.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

// Two blocks, so a cached layer feeds another.
constexpr const char* kTwoBlocks = R"(name: two-blocks
input: [12]
layers:
  - embedding: {vocab: 256, dim: 16}
  - positional: {context: 12}
  - transformer: {heads: 2, mlp: 24}
  - transformer: {heads: 4}
  - layernorm
  - linear: {out: 256}
)";

std::vector<int32_t> tokens(int64_t n, uint64_t seed) { return testing::randomTokens(n, seed); }

TEST(DecodeTest, DecodingWholeSequencesGivesForwardsRows) {
  cpu::CpuBackend be(cpu::CpuOptions{2});
  Model m(parseModelSpec(kTwoBlocks));
  m.build(be, 3);
  const Tensor x = toDeviceI32(be, {2, 12}, tokens(24, 1));
  Stash stash;
  const auto want = toHost(m.forward(x, stash, ForwardContext{false, 0}));
  // Close, not bitwise: attention decodes each sequence's 12 rows on its own, and the CPU
  // backend multiplies fewer than 16 rows by a weight matrix with its row kernels, more
  // with sgemm (backends/cpu/row_products.h), which sum in another order.
  DecodeState state;
  testing::expectCloseLogits(toHost(m.decode(x, state)), want, "whole sequences");
  // The same sequences fed in pieces: 5 tokens, then 1, then 6.
  DecodeState pieces;
  std::vector<float> got;
  const auto ids = tokens(24, 1);
  for (auto [from, n] : {std::pair<int64_t, int64_t>{0, 5}, {5, 1}, {6, 6}}) {
    std::vector<int32_t> part;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = from; t < from + n; ++t) part.push_back(ids[b * 12 + t]);
    const auto rows = toHost(m.decode(toDeviceI32(be, {2, n}, part), pieces));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t < n; ++t)
        for (int64_t v = 0; v < 256; ++v)
          ASSERT_NEAR(rows[(b * n + t) * 256 + v], want[(b * 12 + from + t) * 256 + v], 1e-5)
              << "sample " << b << " token " << from + t;
  }
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        m.decode(toDeviceI32(be, {2, 1}, {1, 2}), pieces);
      },
      {"13 tokens do not fit the context of 12"});
}

// The acceptance check of generation: decoding with the cache chooses the same tokens as
// decoding without it, from the same logits (to the BLAS's rounding: expectCloseLogits).
TEST(DecodeTest, TheCacheGivesTheTokensAndCloseLogitsOfRecomputingThePrefix) {
  cpu::CpuBackend be(cpu::CpuOptions{2});
  Model m(parseModelSpec(kTwoBlocks));
  m.build(be, 4);
  const std::vector<int32_t> prompt = tokens(3, 2);
  for (float temperature : {0.0f, 0.8f}) {
    const SamplingOptions o{temperature, 0, 9};
    std::vector<int32_t> heard;
    const Generation cached =
        generate(m, prompt, 9, o, true, [&](int32_t t) { heard.push_back(t); });
    const Generation plain = generate(m, prompt, 9, o, false);
    ASSERT_EQ(cached.tokens.size(), 9u);
    EXPECT_EQ(cached.tokens, plain.tokens);
    EXPECT_EQ(heard, cached.tokens);
    ASSERT_EQ(cached.logits.size(), plain.logits.size());
    for (size_t i = 0; i < cached.logits.size(); ++i)
      testing::expectCloseLogits(cached.logits[i], plain.logits[i], "token " + std::to_string(i));
    EXPECT_EQ(cached.intervals_s.size(), 8u);
    EXPECT_GT(cached.first_token_s, 0.0);
  }
}

// `agree` decides the token fed back and reported (a tensor rank's: rank 0's): here always
// 7, whatever was chosen; the step after sees the prompt and 7.
TEST(DecodeTest, AgreedTokensAreTheOnesFedBack) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(kTwoBlocks));
  m.build(be, 4);
  const std::vector<int32_t> prompt = tokens(3, 2);
  std::vector<int32_t> chosen;
  const Generation g = generate(m, prompt, 3, {}, true, {}, [&](int32_t t) {
    chosen.push_back(t);
    return 7;
  });
  EXPECT_EQ(g.tokens, std::vector<int32_t>(3, 7));
  ASSERT_EQ(chosen.size(), 3u);
  std::vector<int32_t> fed = prompt;
  fed.push_back(7);
  const Generation after = generate(m, fed, 1, {});
  testing::expectCloseLogits(g.logits[1], after.logits[0], "the step after an agreed 7");
  EXPECT_EQ(chosen[1], after.tokens[0]);
}

// What a sequence resumed elsewhere after a loss does (runtime GenerationLedger): its
// prompt and the tokens it had, prefilled, with the sampler's seed advanced past the draws
// made (chooseToken draws once per sampled token), give the tokens it would have chosen.
TEST(DecodeTest, ASequenceResumedFromItsTokensWithTheSeedAdvancedChoosesTheSameTokens) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(kTwoBlocks));
  m.build(be, 4);
  const std::vector<int32_t> prompt = tokens(3, 2);
  for (const SamplingOptions o :
       {SamplingOptions{}, SamplingOptions{0.9f, 0, 5}, SamplingOptions{1.3f, 40, 11, 0.9f}}) {
    const Generation whole = generate(m, prompt, 8, o);
    ASSERT_EQ(whole.tokens.size(), 8u);
    for (const size_t n : {size_t{1}, size_t{5}}) {
      std::vector<int32_t> had = prompt;
      had.insert(had.end(), whole.tokens.begin(), whole.tokens.begin() + static_cast<long>(n));
      SamplingOptions resumed = o;
      if (o.temperature > 0) resumed.seed = Rng::seedAfter(o.seed, n);
      const Generation rest = generate(m, had, static_cast<int64_t>(8 - n), resumed);
      EXPECT_EQ(rest.tokens, std::vector<int32_t>(whole.tokens.begin() + static_cast<long>(n),
                                                  whole.tokens.end()))
          << "temperature " << o.temperature << ", resumed after " << n;
    }
    if (o.temperature > 0) {  // and the seed as it was would draw another stream
      std::vector<int32_t> had = prompt;
      had.insert(had.end(), whole.tokens.begin(), whole.tokens.begin() + 1);
      EXPECT_NE(generate(m, had, 7, o).tokens,
                std::vector<int32_t>(whole.tokens.begin() + 1, whole.tokens.end()));
    }
  }
}

TEST(DecodeTest, GenerationStopsAfterAnEndToken) {
  // With the agreed tokens 5, 6, 7, ... and 7 an end token, the third token is the last;
  // the tokens and logits before it are those of a run without end tokens.
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(kTwoBlocks));
  m.build(be, 4);
  const std::vector<int32_t> prompt = tokens(3, 2);
  int32_t next = 5;
  auto counting = [&](int32_t) { return next++; };
  const Generation whole = generate(m, prompt, 6, {}, true, {}, counting);
  next = 5;
  std::vector<int32_t> heard;
  const Generation ended =
      generate(m, prompt, 6, {}, true, [&](int32_t t) { heard.push_back(t); }, counting, {9, 7});
  EXPECT_EQ(whole.tokens, (std::vector<int32_t>{5, 6, 7, 8, 9, 10}));
  EXPECT_EQ(ended.tokens, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(heard, ended.tokens);
  ASSERT_EQ(ended.logits.size(), 3u);
  EXPECT_EQ(ended.logits[2], whole.logits[2]);
}

// One token of each of several sequences at different positions, decoded as one batch
// (Model::decodeEach), gives each sequence's row of decoding it alone: the same products
// per row, so to the BLAS's rounding of a B-row product against a 1-row one; and the
// default Layer::decodeEach (each sequence in turn) agrees with attention's own.
TEST(DecodeTest, OneTokenOfEachSequenceDecodedAsOneBatchGivesEachSequencesRow) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(kTwoBlocks));
  m.build(be, 5);
  const std::vector<std::vector<int32_t>> prompts = {tokens(3, 1), tokens(7, 2), tokens(1, 3),
                                                     tokens(10, 4)};
  std::vector<DecodeState> alone(prompts.size()), batched(prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto n = static_cast<int64_t>(prompts[b].size());
    m.decode(toDeviceI32(be, {1, n}, prompts[b]), alone[b]);
    m.decode(toDeviceI32(be, {1, n}, prompts[b]), batched[b]);
  }
  const std::vector<int32_t> next = {65, 66, 67, 68};
  std::vector<DecodeState*> states;
  for (DecodeState& s : batched) states.push_back(&s);
  const auto rows = toHost(m.decodeEach(toDeviceI32(be, {4, 1}, next), states));
  ASSERT_EQ(rows.size(), 4u * 256);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto want = toHost(m.decode(toDeviceI32(be, {1, 1}, {next[b]}), alone[b]));
    testing::expectCloseLogits(std::vector<float>(rows.begin() + static_cast<long>(b * 256),
                                                  rows.begin() + static_cast<long>((b + 1) * 256)),
                               want, "sequence " + std::to_string(b));
    EXPECT_EQ(batched[b].children[1].position, alone[b].children[1].position);  // positional
  }
  // Every state moved on by one token: a second batched step still matches.
  const auto rows2 = toHost(m.decodeEach(toDeviceI32(be, {4, 1}, {1, 2, 3, 4}), states));
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto want =
        toHost(m.decode(toDeviceI32(be, {1, 1}, {static_cast<int32_t>(b + 1)}), alone[b]));
    testing::expectCloseLogits(std::vector<float>(rows2.begin() + static_cast<long>(b * 256),
                                                  rows2.begin() + static_cast<long>((b + 1) * 256)),
                               want, "second step, sequence " + std::to_string(b));
  }
  // A sequence past its context is named; so is a batch that does not match its states.
  DecodeState full;
  m.decode(toDeviceI32(be, {1, 12}, tokens(12, 9)), full);
  std::vector<DecodeState*> over = {&full};
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        m.decodeEach(toDeviceI32(be, {1, 1}, {5}), over);
      },
      {"do not fit the context of 12"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        m.decodeEach(toDeviceI32(be, {2, 1}, {5, 6}), over);
      },
      {"decoding one token of 1 sequences", "expects [1, 1]"});
}

// The default Layer::decodeEach, each sequence's decode in turn, agrees with the
// transformer block's batched one (its attention projecting the rows together).
TEST(DecodeTest, TheDefaultDecodeEachAgreesWithABlocksOwn) {
  cpu::CpuBackend be(cpu::CpuOptions{1});
  Model m(parseModelSpec(kTwoBlocks));
  m.build(be, 6);
  Layer& block = m.layer(2);
  ASSERT_EQ(block.type(), "transformer");
  std::vector<DecodeState> own(3), fallback(3);
  for (size_t b = 0; b < 3; ++b) {
    const auto n = static_cast<int64_t>(2 + 3 * b);
    const Tensor x = toDevice(be, {1, n, 16}, testing::randomVector(b + 1, n * 16));
    block.decode(x, own[b]);
    block.decode(x, fallback[b]);
  }
  const Tensor x = toDevice(be, {3, 1, 16}, testing::randomVector(9, 48));
  std::vector<DecodeState*> a = {&own[0], &own[1], &own[2]};
  std::vector<DecodeState*> f = {&fallback[0], &fallback[1], &fallback[2]};
  const auto got = toHost(block.decodeEach(x, a));
  const auto want = toHost(block.Layer::decodeEach(x, f));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << i;
}

TEST(DecodeTest, RequestsThatCannotBeServedAreNamed) {
  cpu::CpuBackend be;
  Model m(parseModelSpec(kTwoBlocks));
  m.build(be, 1);
  testing::expectThrowWith<InvalidArgument>(
      [&] { generate(m, tokens(10, 1), 3, {}); },
      {"a prompt of 10 tokens and 3 new ones exceed the context of 12"});
  testing::expectThrowWith<InvalidArgument>([&] { generate(m, {}, 3, {}); }, {"prompt is empty"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        generate(m, {1, 300}, 3, {});
      },
      {"token 300 at 1", "vocab of 256"});
  Model mismatch(
      parseModelSpec("input: [4]\nlayers: [{embedding: {vocab: 9, dim: 4}}, "
                     "{linear: {out: 12}}]\n"));
  mismatch.build(be, 1);
  testing::expectThrowWith<InvalidArgument>([&] { generate(mismatch, {1}, 1, {}); },
                                            {"chooses among 12 tokens but embeds only 9"});
  Model classifier(parseModelSpec(testing::kTinyNet));
  classifier.build(be, 1);
  testing::expectThrowWith<InvalidArgument>([&] { generate(classifier, {1}, 1, {}); },
                                            {"is not a language model"});
  Model cnn(
      parseModelSpec("input: [4]\nlayers: [{embedding: {vocab: 9, dim: 4}}, flatten, "
                     "{linear: {out: 9}}]\n"));
  cnn.build(be, 1);
  DecodeState state;
  EXPECT_THROW(cnn.decode(toDeviceI32(be, {1, 2}, {1, 2}), state), Unsupported);
  Model open(
      parseModelSpec("input: [4]\nlayers: [{embedding: {vocab: 9, dim: 4}}, "
                     "{attention: {heads: 1, causal: false}}, {linear: {out: 9}}]\n"));
  open.build(be, 1);
  DecodeState open_state;
  testing::expectThrowWith<Unsupported>(
      [&] {
        open.decode(toDeviceI32(be, {1, 2}, {1, 2}), open_state);
      },
      {"without the causal mask cannot decode"});
}

TEST(SamplingTest, GreedyTakesTheFirstLargestAndTopKBoundsTheDraw) {
  Rng rng(1);
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  EXPECT_EQ(chooseToken(logits, {}, rng), 1);
  EXPECT_EQ(chooseToken(logits, {1.0f, 1, 5}, rng), 1);  // top-1: the first largest
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(chooseToken(logits, {1.0f, 3, 5}, rng));
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3, 4}));
  // Seeded: the same draws from the same seed.
  Rng a(7), b(7);
  for (int i = 0; i < 20; ++i)
    EXPECT_EQ(chooseToken(logits, {0.7f, 0, 0}, a), chooseToken(logits, {0.7f, 0, 0}, b));
  // A low temperature concentrates the draw on the largest logits.
  int largest = 0;
  for (int i = 0; i < 200; ++i) largest += chooseToken({0.0f, 3.0f}, {0.2f, 0, 0}, rng) == 1;
  EXPECT_GT(largest, 195);
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        chooseToken(logits, {-1.0f, 0, 0}, rng);
      },
      {"temperature must be 0 (greedy) or positive"});
  testing::expectThrowWith<InvalidArgument>(
      [&] {
        chooseToken(logits, {1.0f, -2, 0}, rng);
      },
      {"top-k must be 0 (all) or positive"});
}

TEST(SamplingTest, TopPDrawsAmongTheFewestTokensHoldingThatProbability) {
  Rng rng(3);
  // Probabilities at temperature 1: about 0.64, 0.24, 0.09, 0.03 for tokens 2, 0, 3, 1.
  const std::vector<float> logits = {1.0f, -1.0f, 2.0f, 0.0f};
  std::set<int32_t> seen;
  for (int i = 0; i < 300; ++i) seen.insert(chooseToken(logits, {1.0f, 0, 9, 0.8f}, rng));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 2}));  // 0.64 < 0.8 <= 0.64 + 0.24
  seen.clear();
  for (int i = 0; i < 100; ++i) seen.insert(chooseToken(logits, {1.0f, 0, 9, 0.5f}, rng));
  EXPECT_EQ(seen, (std::set<int32_t>{2}));  // the largest alone holds half
  seen.clear();
  for (int i = 0; i < 400; ++i) seen.insert(chooseToken(logits, {1.0f, 0, 9, 1.0f}, rng));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2, 3}));
  // With top-k first: among tokens 2 and 0 only, top-p 0.9 of those two keeps both.
  seen.clear();
  for (int i = 0; i < 300; ++i) seen.insert(chooseToken(logits, {1.0f, 2, 9, 0.9f}, rng));
  EXPECT_EQ(seen, (std::set<int32_t>{0, 2}));
  for (float bad : {0.0f, -0.5f, 1.5f})
    testing::expectThrowWith<InvalidArgument>(
        [&] {
          chooseToken(logits, {1.0f, 0, 9, bad}, rng);
        },
        {"top-p must be in (0, 1]"});
}

}  // namespace
}  // namespace tandem

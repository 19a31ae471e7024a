// Llama parity: Hugging Face folders (tests/data/llama, written by scripts/llama-fixtures
// from a PyTorch Llama written from transformers' definition) imported and run on the CPU
// and every OpenCL device: the logits of every prompt position within 1e-4 of PyTorch's,
// and greedy decoding with the key/value cache choosing PyTorch's tokens from logits
// within 1e-4 — one sequence at a time and several in one batch. Two configurations:
// grouped-query attention with llama3 rope scaling and f32 weights; Qwen2's q/k/v biases,
// one key/value head, linear rope scaling, a tied head and bf16 weights. Prints the
// largest error per model and device. Export and re-import give back the same model.
#include <gtest/gtest.h>

#include <filesystem>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backends/cpu/cpu_backend.h"
#include "backends/opencl/devices.h"
#include "backends/registry.h"
#include "core/error.h"
#include "core/file.h"
#include "core/generate.h"
#include "hf/llama.h"
#include "hf/safetensors.h"
#include "hf/text_codec.h"
#include "tests/test_util.h"

namespace tandem::hf {
namespace {

const std::string kFixtures = TANDEM_SOURCE_DIR "/tests/data/llama/";
constexpr double kTolerance = 1e-4;

std::vector<std::string> devices() {
  std::vector<std::string> out = {"cpu"};
  for (const auto& d : opencl::listClDevices()) out.push_back(d.label());
  return out;
}

// max |a - b| over a row, failing the test at the first beyond the tolerance.
double compareRow(const float* got, const std::vector<double>& want, const std::string& what) {
  double worst = 0;
  for (size_t v = 0; v < want.size(); ++v) {
    const double err = std::abs(got[v] - want[v]);
    worst = std::max(worst, err);
    if (err > kTolerance) {
      ADD_FAILURE() << what << ", logit " << v << ": " << got[v] << " vs " << want[v];
      return worst;
    }
  }
  return worst;
}

class LlamaParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaParityTest, LogitsAndGreedyTokensArePyTorchs) {
  const std::string dir = kFixtures + GetParam();
  const auto expected = nlohmann::json::parse(readFile(dir + "/expected.json", "fixture"));
  const ModelFile file = importLlama(dir);
  for (const std::string& device : devices()) {
    SCOPED_TRACE(device);
    const std::unique_ptr<Backend> be = makeBackend(device, BackendOptions{1});
    const std::unique_ptr<Model> model = loadModel(file, *be);
    const int64_t vocab = model->outputShape()[1];
    double worst = 0;
    std::vector<DecodeState> states(expected["prompts"].size());
    std::vector<int32_t> firsts;
    for (size_t p = 0; p < expected["prompts"].size(); ++p) {
      const auto& prompt = expected["prompts"][p];
      const auto ids = prompt["ids"].get<std::vector<int32_t>>();
      const auto n = static_cast<int64_t>(ids.size());
      const auto logits = toHost(model->decode(toDeviceI32(*be, {1, n}, ids), states[p]));
      for (int64_t t = 0; t < n; ++t)
        worst = std::max(
            worst,
            compareRow(logits.data() + t * vocab, prompt["logits"][t].get<std::vector<double>>(),
                       "prompt " + std::to_string(p) + " position " + std::to_string(t)));
      const SamplingOptions greedy{0.0f, 0, 1};
      const Generation g = generate(*model, ids, 8, greedy, true);
      EXPECT_EQ(g.tokens, prompt["greedy"].get<std::vector<int32_t>>()) << "prompt " << p;
      for (size_t s = 0; s < g.logits.size(); ++s)
        worst = std::max(
            worst,
            compareRow(g.logits[s].data(), prompt["greedy_logits"][s].get<std::vector<double>>(),
                       "prompt " + std::to_string(p) + " step " + std::to_string(s)));
      firsts.push_back(g.tokens.at(0));
    }
    // Every prompt's first new token as one batch (what serving several sequences runs):
    // each row is that sequence's second greedy step.
    std::vector<DecodeState*> batch;
    for (DecodeState& s : states) batch.push_back(&s);
    const auto rows = toHost(model->decodeEach(
        toDeviceI32(*be, {static_cast<int64_t>(firsts.size()), 1}, firsts), batch));
    for (size_t p = 0; p < firsts.size(); ++p)
      worst = std::max(
          worst, compareRow(rows.data() + p * vocab,
                            expected["prompts"][p]["greedy_logits"][1].get<std::vector<double>>(),
                            "batched step, prompt " + std::to_string(p)));
    std::printf("[ parity   ] %s on %s: largest logit error %.2e\n", GetParam().c_str(),
                device.c_str(), worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LlamaParityTest, ::testing::Values("llama-gqa", "qwen2-tied"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(LlamaImportTest, ExportThenImportGivesTheSameModel) {
  for (const char* fixture : {"llama-gqa", "qwen2-tied"}) {
    SCOPED_TRACE(fixture);
    const ModelFile original = importLlama(kFixtures + fixture, 16);
    EXPECT_EQ(original.spec.input, Shape{16});
    // bf16 weights export as bf16 bitwise; f32 as f32.
    const std::string dtype = std::string(fixture) == "qwen2-tied" ? "BF16" : "F32";
    const std::string out = testing::freshDir("llama-export");
    exportLlama(original, out, dtype);
    const ModelFile again = importLlama(out, 16);
    EXPECT_EQ(again.spec.layers.size(), original.spec.layers.size());
    for (size_t i = 0; i < original.spec.layers.size(); ++i)
      EXPECT_EQ(again.spec.layers[i].attrs, original.spec.layers[i].attrs) << "layer " << i;
    ASSERT_EQ(again.params.size(), original.params.size());
    for (size_t i = 0; i < original.params.size(); ++i) {
      EXPECT_EQ(again.params[i].name, original.params[i].name);
      EXPECT_EQ(again.params[i].shape, original.params[i].shape);
      EXPECT_EQ(again.params[i].data, original.params[i].data) << original.params[i].name;
    }
    // The tied head became a tensor of its own, written as lm_head.
    SafetensorsFolder weights(out);
    EXPECT_TRUE(weights.contains("lm_head.weight"));
    EXPECT_TRUE(weights.contains("model.layers.0.self_attn.k_proj.weight"));
  }
}

// `tandem import` and `model: DIR` write the folder's model without building it: the bytes
// are those of the model built and loaded with importLlama's file (every name, shape and
// order the layers' own), for an untied f32 model and a tied bf16 one with biases.
TEST(LlamaImportTest, ImportWithoutBuildingWritesTheBytesOfTheLoadedModel) {
  for (const char* fixture : {"llama-gqa", "qwen2-tied"}) {
    SCOPED_TRACE(fixture);
    const LlamaImport plan = planLlamaImport(kFixtures + fixture, 16);
    const ModelFile file = importLlama(kFixtures + fixture, 16);
    cpu::CpuBackend be;
    const std::unique_ptr<Model> model = loadModel(file, be);
    const std::vector<uint8_t> built = serializeModel(*model, nullptr, file.metadata);
    EXPECT_EQ(serializeModelFile(plan.spec, plan.params, plan.metadata), built);
    // What `tandem import` writes: f32 tensors copied from the safetensors file, others
    // widened; the same bytes.
    const bool f32 = std::string(fixture) == "llama-gqa";
    for (const ParamFill& p : plan.params)
      EXPECT_EQ(p.extents.empty(), !f32) << p.name << " is copied only from f32 tensors";
    const std::string path = testing::freshDir("llama_import_write") + "/model.tdm";
    writeModelFile(path, plan.spec, plan.params, plan.metadata);
    EXPECT_EQ(readFile(path, "model file"), std::string(built.begin(), built.end()));
  }
}

TEST(LlamaImportTest, ConfigsAndWeightsThatDoNotFitAreNamed) {
  const std::string good = readFile(kFixtures + "llama-gqa/config.json", "config");
  const auto with = [&](const std::string& key, const nlohmann::json& value) {
    auto j = nlohmann::json::parse(good);
    if (value.is_null() && key != "rope_scaling")
      j.erase(key);
    else
      j[key] = value;
    return j.dump();
  };
  testing::expectThrowWith<FormatError>(
      [&] { parseLlamaConfig(with("hidden_size", nullptr), "c.json"); },
      {"c.json", "field 'hidden_size' is missing"});
  testing::expectThrowWith<FormatError>(
      [&] { parseLlamaConfig(with("num_key_value_heads", 3), "c.json"); },
      {"'num_key_value_heads'", "3 does not divide 4"});
  testing::expectThrowWith<FormatError>([&] { parseLlamaConfig(with("vocab_size", -5), "c.json"); },
                                        {"'vocab_size' is -5, not a positive integer"});
  testing::expectThrowWith<Unsupported>(
      [&] { parseLlamaConfig(with("model_type", "gpt_neox"), "c.json"); },
      {"model_type 'gpt_neox'"});
  testing::expectThrowWith<Unsupported>(
      [&] { parseLlamaConfig(with("hidden_act", "gelu"), "c.json"); }, {"hidden_act \"gelu\""});
  testing::expectThrowWith<Unsupported>(
      [&] {
        parseLlamaConfig(with("rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}}), "c.json");
      },
      {"rope_scaling type 'yarn'"});
  auto mistral = nlohmann::json::parse(good);
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 4096;
  testing::expectThrowWith<Unsupported>([&] { parseLlamaConfig(mistral.dump(), "c.json"); },
                                        {"sliding attention window (4096)"});
  mistral["sliding_window"] = nullptr;  // Mistral v0.2 on: full attention
  EXPECT_EQ(parseLlamaConfig(mistral.dump(), "c.json").model_type, "mistral");
  testing::expectThrowWith<FormatError>([&] { parseLlamaConfig("[1]", "c.json"); },
                                        {"not a JSON object"});

  // Weights of another shape than the config's: named.
  const std::string dir = testing::freshDir("llama-bad");
  std::ofstream(dir + "/config.json") << with("intermediate_size", 65);
  SafetensorsFolder src(kFixtures + "llama-gqa");
  std::vector<TensorData> tensors;
  for (const std::string& name : src.names()) {
    const TensorEntry& e = src.entry(name);
    SafetensorsFile f(kFixtures + "llama-gqa/model.safetensors");
    const auto bytes = f.bytes(*f.find(name));
    tensors.push_back({name, e.dtype, e.shape, {bytes.begin(), bytes.end()}});
  }
  writeSafetensors(dir + "/model.safetensors", tensors);
  testing::expectThrowWith<FormatError>(
      [&] { importLlama(dir); },
      {"'model.layers.0.mlp.gate_proj.weight' is [64, 32]", "config.json implies [65, 32]"});
  tensors.erase(tensors.begin());  // a tensor missing
  std::ofstream(dir + "/config.json") << good;
  writeSafetensors(dir + "/model.safetensors", tensors);
  testing::expectThrowWith<InvalidArgument>([&] { importLlama(dir); }, {"has no tensor"});
  testing::expectThrowWith<InvalidArgument>([&] { importLlama(kFixtures + "llama-gqa", 65); },
                                            {"a context of 65 tokens", "64"});
}

TEST(LlamaImportTest, EndOfTextIdsComeWithTheModelAndGoBackOut) {
  // config.json's eos_token_id (an id or a list), generation_config.json's over it; kept
  // in the model file, read by its text codec, written back on export.
  const std::string good = readFile(kFixtures + "llama-gqa/config.json", "config");
  auto j = nlohmann::json::parse(good);
  const int64_t vocab = j["vocab_size"];
  EXPECT_TRUE(parseLlamaConfig(good, "c.json").eos_ids.empty());
  j["eos_token_id"] = 2;
  EXPECT_EQ(parseLlamaConfig(j.dump(), "c.json").eos_ids, std::vector<int64_t>{2});
  j["eos_token_id"] = {3, 5};
  EXPECT_EQ(parseLlamaConfig(j.dump(), "c.json").eos_ids, (std::vector<int64_t>{3, 5}));
  j["eos_token_id"] = nullptr;
  EXPECT_TRUE(parseLlamaConfig(j.dump(), "c.json").eos_ids.empty());
  j["eos_token_id"] = vocab;
  testing::expectThrowWith<FormatError>(
      [&] { parseLlamaConfig(j.dump(), "c.json"); },
      {"c.json", "'eos_token_id' holds " + std::to_string(vocab), "not a token id"});
  j["eos_token_id"] = "2";
  testing::expectThrowWith<FormatError>([&] { parseLlamaConfig(j.dump(), "c.json"); },
                                        {"'eos_token_id' holds \"2\""});

  const std::string dir = testing::freshDir("llama-eos");
  j["eos_token_id"] = 2;
  std::ofstream(dir + "/config.json") << j.dump();
  std::filesystem::copy_file(kFixtures + "llama-gqa/model.safetensors", dir + "/model.safetensors");
  ModelFile file = importLlama(dir, 16);
  EXPECT_EQ(std::get<std::vector<int64_t>>(file.metadata.at("eos_token_ids")),
            std::vector<int64_t>{2});
  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": [4, 7]})";
  file = importLlama(dir, 16);
  EXPECT_EQ(std::get<std::vector<int64_t>>(file.metadata.at("eos_token_ids")),
            (std::vector<int64_t>{4, 7}));
  const TextCodec codec = TextCodec::forModel(file, vocab);
  EXPECT_TRUE(codec.ends(4) && codec.ends(7));
  EXPECT_FALSE(codec.ends(2));
  const std::string out = testing::freshDir("llama-eos-export");
  exportLlama(file, out);
  EXPECT_EQ(parseLlamaConfig(readFile(out + "/config.json", "config"), "c.json").eos_ids,
            (std::vector<int64_t>{4, 7}));
  // Ids the model cannot produce, in the file's metadata, are refused when read.
  file.metadata["eos_token_ids"] = std::vector<int64_t>{vocab};
  testing::expectThrowWith<FormatError>([&] { (void)TextCodec::forModel(file, vocab); },
                                        {"end-of-text id " + std::to_string(vocab)});
  EXPECT_FALSE(TextCodec().ends(0));
}

}  // namespace
}  // namespace tandem::hf

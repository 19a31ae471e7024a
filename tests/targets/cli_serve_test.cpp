// `tandem serve` as a user runs it: the program in the background, curl as the client
// (whole and streamed answers: the greedy text `generate` gives), SIGTERM to stop it; and
// what it refuses before listening.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "core/generate.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "hf/llama.h"
#include "hf/safetensors.h"
#include "hf/text_codec.h"
#include "tests/targets/cli_util.h"
#include "tests/test_util.h"

namespace tandem::testing::cli {
namespace {

using nlohmann::json;

// Text as a served JSON string carries it (bytes that are not UTF-8 as U+FFFD).
std::string asServed(const std::vector<int32_t>& tokens) {
  const std::string bytes(tokens.begin(), tokens.end());
  return json::parse(json(bytes).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

// The start of a shell script that runs `tandem serve ARGS` in the background (its pid in
// $pid, its output in `log`) and, once it says it is serving (polled `polls` times, 50 ms
// apart), has its port in $port.
std::string startServer(const std::string& args, const std::string& log, int polls = 200) {
  std::string script = "'";
  script += TANDEM_CLI;
  script += "' serve " + args + " --listen 127.0.0.1:0 > " + log + " 2>&1 & pid=$!\n";
  script += "for i in $(seq " + std::to_string(polls) + "); do grep -q '^serving' " + log +
            " && break; sleep 0.05; done\n";
  script += "port=$(sed -n 's|.*http://127.0.0.1:\\([0-9]*\\)/v1.*|\\1|p' " + log + ")\n";
  return script;
}

TEST(CliServeTest, CurlGetsTheTextGenerateGivesWholeAndStreamed) {
  const std::string dir = freshDir("cli-serve");
  const std::string model = dir + "/gpt.tdm";
  cpu::CpuBackend be;
  Model m(parseModelSpec(kTinyGpt));
  m.build(be, 3);
  saveModel(model, m, nullptr, {});
  const Generation want = generate(m, {'T', 'h', 'e'}, 5, SamplingOptions{});
  // One shell: the server in the background, its port read from its first line, two
  // requests, then SIGTERM and its exit code (every wait bounded).
  const std::string log = dir + "/serve.log";
  std::string script = startServer(model + " --name tiny", log);
  script += "curl -s --max-time 30 http://127.0.0.1:$port/v1/completions ";
  script +=
      "-d '{\"model\": \"tiny\", \"prompt\": \"The\", \"max_tokens\": 5, \"temperature\": 0}'\n";
  script += "echo; echo '---'\n";
  script += "curl -sN --max-time 30 http://127.0.0.1:$port/v1/completions ";
  script += "-d '{\"prompt\": \"The\", \"max_tokens\": 5, \"temperature\": 0, \"stream\": true}'\n";
  script += "echo '---'\n";
  script += "kill -TERM $pid; wait $pid; echo \"exit $?\"; cat " + log + "\n";
  std::ofstream(dir + "/run.sh") << script;
  const CliRun r = runCommand("bash " + dir + "/run.sh");
  ASSERT_EQ(r.code, 0) << r.out;
  std::istringstream lines(r.out);
  std::string whole, line, streamed;
  std::getline(lines, whole);
  const json answer = json::parse(whole, nullptr, false);
  ASSERT_FALSE(answer.is_discarded()) << r.out;
  EXPECT_EQ(answer["choices"][0]["text"], asServed(want.tokens)) << r.out;
  EXPECT_EQ(answer["model"], "tiny");
  std::getline(lines, line);  // ---
  bool done = false;
  while (std::getline(lines, line) && line != "---") {
    if (line.rfind("data: ", 0) != 0) continue;
    const std::string data = line.substr(6);
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    streamed += json::parse(data)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_TRUE(done) << r.out;
  EXPECT_EQ(asServed({streamed.begin(), streamed.end()}), asServed(want.tokens)) << r.out;
  EXPECT_NE(r.out.find("exit 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("serving 'tiny' (context"), std::string::npos) << r.out;
}

// A GPT with room for a chat prompt (the template's tags are 25 bytes).
constexpr const char* kChatGpt = R"(name: chat-gpt
input: [40]
layers:
  - embedding: {vocab: 256, dim: 16}
  - positional: {context: 40}
  - transformer: {heads: 2, mlp: 32}
  - layernorm
  - linear: {out: 256}
)";

TEST(CliServeTest, TheOfficialOpenAiNodeClientCompletesChatsAndStreams) {
  const std::string npm = std::string(TANDEM_NPM_DIR) + "/node_modules";
  if (!std::filesystem::exists(npm + "/openai/package.json"))
    GTEST_SKIP() << "the OpenAI Node client is not in " << npm
                 << ": scripts/setup --with-test-clients installs it";
  const std::string dir = freshDir("cli-serve-openai");
  const std::string model = dir + "/gpt.tdm";
  cpu::CpuBackend be;
  Model m(parseModelSpec(kChatGpt));
  m.build(be, 4);
  saveModel(model, m, nullptr, {});
  const std::string chat_prompt = "<|user|>\nHi\n<|assistant|>\n";
  const Generation completion = generate(m, {'T', 'h', 'e'}, 6, SamplingOptions{});
  const Generation chat = generate(m, std::vector<int32_t>(chat_prompt.begin(), chat_prompt.end()),
                                   5, SamplingOptions{});
  std::ofstream(dir + "/keys") << "key-0123456789abcdef\n";
  std::filesystem::permissions(
      dir + "/keys", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const std::string log = dir + "/serve.log";
  std::string script = startServer(model + " --api-key-file " + dir + "/keys", log);
  script += "NODE_PATH=" + npm + " timeout 60 node " + std::string(TANDEM_SOURCE_DIR) +
            "/tests/serve/openai_client.cjs http://127.0.0.1:$port/v1 key-0123456789abcdef "
            "chat-gpt; echo \"node exit $?\"\n";
  script += "kill -TERM $pid; wait $pid; cat " + log + "\n";
  std::ofstream(dir + "/run.sh") << script;
  const CliRun r = runCommand("bash " + dir + "/run.sh");
  ASSERT_NE(r.out.find("node exit 0"), std::string::npos) << r.out;
  const json got = json::parse(r.out.substr(0, r.out.find('\n')), nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << r.out;
  EXPECT_EQ(got["models"], json::array({"chat-gpt"}));
  EXPECT_EQ(got["completion"], asServed(completion.tokens)) << r.out;
  EXPECT_EQ(got["streamed"], got["completion"]) << r.out;
  EXPECT_EQ(got["finish"], "length");
  EXPECT_EQ(got["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(got["usage"]["completion_tokens"], 6);
  EXPECT_EQ(got["chat"], asServed(chat.tokens)) << r.out;
  EXPECT_EQ(got["chat_role"], "assistant");
  EXPECT_EQ(got["chat_streamed"], got["chat"]) << r.out;
  EXPECT_EQ(got["wrong_key"], 401) << r.out;
}

TEST(CliServeTest, AJobsStagesServeTheTextOneProcessGives) {
  const std::string dir = freshDir("cli-serve-job");
  std::ofstream(dir + "/gpt.yaml") << kChatGpt;
  cpu::CpuBackend be;
  Model m(parseModelSpec(kChatGpt));
  m.build(be, 8);
  saveModel(dir + "/gpt.tdm", m, nullptr, {});
  const Generation want = generate(m, {'T', 'h', 'e'}, 12, SamplingOptions{});
  std::ofstream(dir + "/job.yaml") << "model: gpt.yaml\nweights: gpt.tdm\n"
                                   << "partition: [[0, 3], [3, 5]]\n";
  const std::string log = dir + "/serve.log";
  std::string script = startServer(dir + "/job.yaml", log, 600);
  for (const char* stream : {"false", "true"}) {
    script += "curl -sN --max-time 60 http://127.0.0.1:$port/v1/completions ";
    script += "-d '{\"prompt\": \"The\", \"max_tokens\": 12, \"temperature\": 0, \"stream\": ";
    script += std::string(stream) + "}'\necho; echo '---'\n";
  }
  // Each stage reports its work as it runs out of it: /metrics shows both (asked for at
  // most 10 s, as the reports come from the workers through the coordinator).
  script +=
      "for i in $(seq 40); do m=$(curl -s --max-time 5 http://127.0.0.1:$port/metrics); "
      "case \"$m\" in *'busy_seconds_total{stage=\"1\"}'*) break;; esac; sleep 0.25; done\n"
      "echo \"$m\" | grep '^tandem_stage_busy'; echo '---'\n";
  script += "kill -TERM $pid; wait $pid; echo \"exit $?\"; cat " + log + "\n";
  std::ofstream(dir + "/run.sh") << script;
  const CliRun r = runCommand("bash " + dir + "/run.sh");
  ASSERT_NE(r.out.find("exit 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(context 40 tokens, 2 stages)"), std::string::npos) << r.out;
  for (const char* stage : {"0", "1"}) {
    const std::string share = std::string("tandem_stage_busy_share{stage=\"") + stage + "\"} ";
    EXPECT_NE(r.out.find(share), std::string::npos) << r.out;
    const std::string total =
        std::string("tandem_stage_busy_seconds_total{stage=\"") + stage + "\"} ";
    const auto at = r.out.find(total);
    ASSERT_NE(at, std::string::npos) << r.out;
    EXPECT_GT(std::stod(r.out.substr(at + total.size())), 0) << r.out;
  }
  std::istringstream lines(r.out);
  std::string whole, line, streamed;
  std::getline(lines, whole);
  const json answer = json::parse(whole, nullptr, false);
  ASSERT_FALSE(answer.is_discarded()) << r.out;
  EXPECT_EQ(answer["choices"][0]["text"], asServed(want.tokens)) << r.out;
  while (std::getline(lines, line) && line != "---") {
  }
  while (std::getline(lines, line) && line != "---")
    if (line.rfind("data: {", 0) == 0)
      streamed += json::parse(line.substr(6))["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(asServed({streamed.begin(), streamed.end()}), asServed(want.tokens)) << r.out;
}

TEST(CliServeTest, WhatCannotBeServedSafelyIsRefusedBeforeListening) {
  const std::string dir = freshDir("cli-serve-refused");
  const std::string model = dir + "/gpt.tdm";
  cpu::CpuBackend be;
  Model m(parseModelSpec(kTinyGpt));
  m.build(be, 3);
  saveModel(model, m, nullptr, {});
  CliRun r = run("serve " + model + " --listen 0.0.0.0:0");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("is not loopback: give --api-key-file"), std::string::npos) << r.out;
  std::ofstream(dir + "/keys") << "key-0123456789abcdef\n";  // mode 644
  r = run("serve " + model + " --listen 0.0.0.0:0 --api-key-file " + dir + "/keys");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("may be read by others"), std::string::npos) << r.out;
  r = run("serve " + model + " --weights " + model);
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--cluster, --key and --weights are for a job file"), std::string::npos)
      << r.out;
  r = run("serve " + model + " --listen nowhere");
  EXPECT_NE(r.code, 0) << r.out;
}

// A Hugging Face folder with a tokenizer.json (tests/data/tokenizer/llama3.json, 659 tokens:
// BOS template, Llama 3's pattern) and random weights: `tandem generate DIR` and `tandem
// serve DIR` read prompts and write text through the tokenizer — the text and the prompt's
// token count of generating in-process from the same folder.
// A Llama-architecture Hugging Face folder in `dir`: a tiny config (GQA, untied head,
// vocab 700), the Llama 3 tokenizer.json fixture, random F32 weights.
void writeTinyLlamaFolder(const std::string& dir) {
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama", "hidden_size": 32,
    "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "vocab_size": 700, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false})";
  std::filesystem::copy_file(TANDEM_SOURCE_DIR "/tests/data/tokenizer/llama3.json",
                             dir + "/tokenizer.json");
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"model.embed_tokens.weight", {700, 32}},
      {"model.norm.weight", {32}},
      {"lm_head.weight", {700, 32}}};
  std::vector<hf::TensorData> tensors;
  uint64_t seed = 1;
  const auto add = [&](const std::string& name, const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const std::vector<float> values = randomVector(seed++, n, -0.5f, 0.5f);
    hf::TensorData t{name, "F32", shape, std::vector<uint8_t>(static_cast<size_t>(n) * 4)};
    std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
    tensors.push_back(std::move(t));
  };
  for (const auto& [name, shape] : shapes) add(name, shape);
  for (int i = 0; i < 2; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    add(l + "input_layernorm.weight", {32});
    add(l + "post_attention_layernorm.weight", {32});
    add(l + "self_attn.q_proj.weight", {32, 32});
    add(l + "self_attn.k_proj.weight", {16, 32});
    add(l + "self_attn.v_proj.weight", {16, 32});
    add(l + "self_attn.o_proj.weight", {32, 32});
    add(l + "mlp.gate_proj.weight", {48, 32});
    add(l + "mlp.up_proj.weight", {48, 32});
    add(l + "mlp.down_proj.weight", {32, 48});
  }
  hf::writeSafetensors(dir + "/model.safetensors", tensors);
}

TEST(CliServeTest, AHuggingFaceFolderGeneratesAndServesThroughItsTokenizer) {
  const std::string dir = freshDir("cli-hf");
  writeTinyLlamaFolder(dir);
  // In-process: the folder's model and tokenizer, greedy.
  const ModelFile file = hf::importLlama(dir);
  cpu::CpuBackend be;
  const std::unique_ptr<Model> model = loadModel(file, be);
  const hf::TextCodec codec = hf::TextCodec::forModel(file, 700);
  ASSERT_FALSE(codec.isBytes());
  const std::string prompt = "Hello world";
  const std::vector<int32_t> ids = codec.encode(prompt);
  ASSERT_LT(ids.size(), prompt.size());  // BPE merged some bytes (and a BOS came first)
  const std::string want = codec.decode(generate(*model, ids, 8, SamplingOptions{}).tokens);

  const CliRun g = run("generate " + dir + " --prompt '" + prompt + "' --tokens 8");
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_EQ(g.out.rfind(prompt + want + "\n---\n", 0), 0u) << g.out;
  EXPECT_NE(g.out.find(std::to_string(ids.size()) + " prompt tokens, 8 new"), std::string::npos)
      << g.out;
  // The same from a job's two stage processes: its coordinator tokenizes.
  std::ofstream(dir + "/job.yaml") << "model: " << dir << "\npartition: [[0, 2], [2, 5]]\n";
  const CliRun j = run("generate " + dir + "/job.yaml --prompt '" + prompt + "' --tokens 8");
  ASSERT_EQ(j.code, 0) << j.out;
  EXPECT_NE(j.out.find("\n" + prompt + want + "\n---\n"), std::string::npos) << j.out;
  EXPECT_NE(j.out.find(std::to_string(ids.size()) + " prompt tokens, 8 new across 2 stages"),
            std::string::npos)
      << j.out;
  // Its second stage split over 2 tensor ranks (key/value head groups, MLP features): the
  // same text. Its first stage cannot be split, and is refused before anything starts.
  std::ofstream(dir + "/split.yaml")
      << "model: " << dir << "\npartition: [[0, 2], {layers: [2, 5], tensor: 2}]\n";
  const CliRun t = run("generate " + dir + "/split.yaml --prompt '" + prompt + "' --tokens 8");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("\n" + prompt + want + "\n---\n"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("stage 1: 2 tensor ranks"), std::string::npos) << t.out;
  std::ofstream(dir + "/first.yaml")
      << "model: " << dir << "\npartition: [{layers: [0, 2], tensor: 2}, [2, 5]]\n";
  const CliRun f = run("generate " + dir + "/first.yaml --prompt '" + prompt + "' --tokens 8");
  EXPECT_NE(f.code, 0) << f.out;
  EXPECT_NE(f.out.find("stage 0 of a generation run cannot be tensor-split"), std::string::npos)
      << f.out;

  const std::string log = dir + "/serve.log";
  std::string script = startServer(dir + " --name hf", log);
  script += "curl -s --max-time 30 http://127.0.0.1:$port/v1/completions ";
  script += "-d '{\"prompt\": \"" + prompt + "\", \"max_tokens\": 8, \"temperature\": 0}'\n";
  script += "echo; kill -TERM $pid; wait $pid; echo \"exit $?\"\n";
  std::ofstream(dir + "/run.sh") << script;
  const CliRun r = runCommand("bash " + dir + "/run.sh");
  ASSERT_EQ(r.code, 0) << r.out;
  const json answer = json::parse(r.out.substr(0, r.out.find('\n')), nullptr, false);
  ASSERT_FALSE(answer.is_discarded()) << r.out;
  EXPECT_EQ(answer["choices"][0]["text"],
            json::parse(json(want).dump(-1, ' ', false, json::error_handler_t::replace)))
      << r.out;
  EXPECT_EQ(answer["usage"]["prompt_tokens"], ids.size()) << r.out;
  EXPECT_EQ(answer["usage"]["completion_tokens"], 8) << r.out;
}

// Text data for a model that brings a tokenizer becomes the tokenizer's ids: a Hugging
// Face folder trains on a corpus in windows of its BPE tokens (as many as the tokenizer
// gives, not one a byte), the model file it saves keeps the tokenizer for `eval`, and a
// job's first stage reads the text the same way.
TEST(CliServeTest, AHuggingFaceFolderTrainsAndEvaluatesOnTextInItsTokenizersIds) {
  const std::string dir = freshDir("cli-hf-text");
  writeTinyLlamaFolder(dir);
  std::string corpus;
  for (int i = 0; corpus.size() < 6000; ++i)
    corpus += "The quick brown fox " + std::to_string(i) + " jumps over the lazy dog.\n";
  std::ofstream(dir + "/corpus.txt") << corpus;
  const hf::TextCodec codec = hf::TextCodec::forModel(hf::importLlama(dir), 700);
  const size_t cut = corpus.size() - corpus.size() / 10;
  const auto windows = [&](const std::string& part) {
    return (static_cast<int64_t>(codec.encodeText(part).size()) - 1) / 64;  // context 64
  };
  const int64_t train = windows(corpus.substr(0, cut)), held = windows(corpus.substr(cut));
  ASSERT_GT(train, 0);
  ASSERT_GT(held, 0);
  ASSERT_LT(train, static_cast<int64_t>(cut) / 64 / 2) << "BPE merges bytes";
  const CliRun t = run("train --model " + dir + " --data text:" + dir +
                       "/corpus.txt --batch 4 --no-progress --save " + dir + "/tuned.tdm");
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_NE(t.out.find("text data: the tokenizer of '" + dir + "' (vocab 700)"), std::string::npos)
      << t.out;
  EXPECT_NE(
      t.out.find(std::to_string(train) + " train / " + std::to_string(held) + " test samples"),
      std::string::npos)
      << t.out;
  const CliRun e = run("eval " + dir + "/tuned.tdm --data text:" + dir + "/corpus.txt");
  ASSERT_EQ(e.code, 0) << e.out;
  EXPECT_NE(e.out.find("text data: the tokenizer of '" + dir + "/tuned.tdm'"), std::string::npos)
      << e.out;
  EXPECT_NE(e.out.find(std::to_string(held) + " samples: test loss"), std::string::npos) << e.out;
  // A job's stages: the first reads the text through the tokenizer its weights carry.
  std::ofstream(dir + "/job.yaml")
      << "model: " << dir << "\ndata: text:" << dir << "/corpus.txt\nbatch: 4\nmicrobatches: 2\n"
      << "partition: [[0, 2], [2, 5]]\n";
  const CliRun j = run("run " + dir + "/job.yaml");
  ASSERT_EQ(j.code, 0) << j.out;
  const std::string steps = std::to_string((train + 3) / 4);  // batch 4
  EXPECT_NE(j.out.find("epoch 1/1 step " + steps + "/" + steps + " "), std::string::npos) << j.out;
}

}  // namespace
}  // namespace tandem::testing::cli

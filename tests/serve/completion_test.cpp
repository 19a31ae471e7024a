// The OpenAI request parser, chat template, answers and the text stream (stop strings,
// whole UTF-8 characters) of serve/completion.h.
#include "serve/completion.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tandem::serve {
namespace {

const ServedModel kModel{"gpt-test", 64};

// The error a body gets: its status and param, and that its message holds `what`.
void expectRefused(const std::string& body, int status, const std::string& param,
                   const std::string& what, bool chat = false) {
  try {
    parseCompletion(body, chat, kModel);
    ADD_FAILURE() << "accepted: " << body;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, status) << body << ": " << e.what();
    EXPECT_EQ(e.param, param) << body << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << body << ": " << e.what();
    const nlohmann::json j = nlohmann::json::parse(errorBody(e));  // valid JSON, always
    EXPECT_NE(j["error"]["message"].get<std::string>().find(what), std::string::npos);
    EXPECT_EQ(j["error"]["type"], e.type);
  }
}

TEST(CompletionRequestTest, ReadsEveryFieldWithTheApisDefaults) {
  CompletionRequest r = parseCompletion(R"({"prompt": "abc"})", false, kModel);
  EXPECT_EQ(r.prompt, "abc");
  EXPECT_EQ(r.max_tokens, 16);  // the completions API's default
  EXPECT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_FALSE(r.seeded);
  EXPECT_FALSE(r.stream);
  r = parseCompletion(
      R"({"model": "gpt-test", "prompt": ["hello"], "max_tokens": 5, "temperature": 0,
          "top_p": 0.5, "top_k": 7, "seed": -3, "stop": ["\n", "."], "stream": true,
          "stream_options": {"include_usage": true}, "n": 1, "user": "u", "logprobs": null,
          "presence_penalty": 0, "echo": false})",
      false, kModel);
  EXPECT_EQ(r.prompt, "hello");
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 7);
  EXPECT_EQ(r.sampling.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_TRUE(r.seeded);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "."}));
  EXPECT_TRUE(r.stream && r.include_usage);
  // Near the end of the context the default is what is left.
  r = parseCompletion(R"({"prompt": ")" + std::string(60, 'x') + R"("})", false, kModel);
  EXPECT_EQ(r.max_tokens, 4);
}

TEST(CompletionRequestTest, ChatMessagesAreRenderedThroughTheTemplate) {
  const CompletionRequest r = parseCompletion(
      R"({"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "Hi", "name": "ann"}], "max_tokens": 3})",
      true, kModel);
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.prompt, "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n");
  EXPECT_EQ(r.max_tokens, 3);
  EXPECT_EQ(parseCompletion(R"({"messages": [{"role": "user", "content": "x"}],
                                "max_completion_tokens": 2})",
                            true, kModel)
                .max_tokens,
            2);
  expectRefused(R"({"messages": []})", 400, "messages", "non-empty list", true);
  expectRefused(R"({"messages": [{"role": "tool", "content": "x"}]})", 400, "messages[0]",
                "role 'tool'", true);
  expectRefused(R"({"messages": [{"role": "user", "content": [1]}]})", 400, "messages[0]",
                "messages[0].content", true);
  expectRefused(R"({"prompt": "x"})", 400, "prompt", "unknown field 'prompt'", true);
  expectRefused(R"({"max_tokens": 2})", 400, "messages", "'messages' is missing", true);
}

TEST(CompletionRequestTest, HostileOrWrongRequestsAreRefusedNamingTheField) {
  expectRefused("{\"prompt\": \"abc\"", 400, "", "not valid JSON");
  expectRefused("[1, 2]", 400, "", "must be a JSON object");
  expectRefused(std::string(100000, '['), 400, "", "nested deeper than 32");
  expectRefused("{\"prompt\": \"a\xff\xfe\"}", 400, "", "not valid JSON");  // not UTF-8
  expectRefused(R"({"prompt": "abc", "max_tokens": -1})", 400, "max_tokens", "[1, 64]");
  expectRefused(R"({"prompt": "abc", "max_tokens": 1e12})", 400, "max_tokens", "an integer");
  expectRefused(R"({"prompt": "abc", "max_tokens": 18446744073709551615})", 400, "max_tokens",
                "at most 64");
  expectRefused(R"({"prompt": "abc", "max_tokens": 62})", 400, "max_tokens",
                "exceed the model's context of 64");
  expectRefused(R"({"prompt": "abc", "temperature": "hot"})", 400, "temperature", "a number");
  expectRefused(R"({"prompt": "abc", "temperature": 2.5})", 400, "temperature", "[0.0");
  expectRefused(R"({"prompt": "abc", "top_p": 0})", 400, "top_p", "above 0");
  expectRefused(R"({"prompt": "abc", "top_k": -2})", 400, "top_k", "top_k");
  expectRefused(R"({"prompt": "abc", "stop": ["a", "b", "c", "d", "e"]})", 400, "stop",
                "at most 4");
  expectRefused(R"({"prompt": "abc", "stop": [""]})", 400, "stop", "empty");
  expectRefused(R"({"prompt": "abc", "stream": 1})", 400, "stream", "true or false");
  expectRefused(R"({"prompt": "abc", "stream_options": {"include_usage": true}})", 400,
                "stream_options", "only for 'stream': true");
  expectRefused(R"({"prompt": "abc", "n": 2})", 400, "n", "not supported");
  expectRefused(R"({"prompt": "abc", "frequency_penalty": 0.5})", 400, "frequency_penalty",
                "not supported");
  expectRefused(R"({"prompt": "abc", "logprobs": 3})", 400, "logprobs", "not supported");
  expectRefused(R"({"prompt": "abc", "functions": []})", 400, "functions",
                "unknown field 'functions'");
  expectRefused(R"({"prompt": ""})", 400, "prompt", "the prompt is empty");
  expectRefused(R"({"prompt": 42})", 400, "prompt", "must be a string");
  expectRefused(R"({"max_tokens": 2})", 400, "prompt", "'prompt' is missing");
  expectRefused(R"({"prompt": ")" + std::string(64, 'x') + R"("})", 400, "prompt",
                "leaves none to generate");
  expectRefused(R"({"prompt": "abc", "model": "gpt-4"})", 404, "model",
                "'gpt-4' is not served here; this server serves 'gpt-test'");
}

TEST(CompletionAnswerTest, WholeAnswersAndChunksHaveTheApisShape) {
  CompletionRequest r = parseCompletion(R"({"prompt": "abc"})", false, kModel);
  nlohmann::json j = nlohmann::json::parse(
      completionBody(r, "cmpl-1", "gpt-test", 7, "de", Finish::kStop, Usage{3, 2}));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "de");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["total_tokens"], 5);
  j = nlohmann::json::parse(chunkBody(r, "cmpl-1", "gpt-test", 7, "d", std::nullopt, true));
  EXPECT_TRUE(j["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(j["choices"][0]["text"], "d");
  r.chat = true;
  j = nlohmann::json::parse(
      completionBody(r, "c-1", "gpt-test", 7, "hi", Finish::kLength, Usage{3, 2}));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  j = nlohmann::json::parse(chunkBody(r, "c-1", "gpt-test", 7, "h", std::nullopt, true));
  EXPECT_EQ(j["object"], "chat.completion.chunk");
  EXPECT_EQ(j["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["delta"]["content"], "h");
  const Usage u{3, 2};
  j = nlohmann::json::parse(chunkBody(r, "c-1", "gpt-test", 7, "", std::nullopt, false, &u));
  EXPECT_TRUE(j["choices"].empty());
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  // Bytes that are not UTF-8 go out as U+FFFD, never as invalid JSON.
  j = nlohmann::json::parse(
      completionBody(r, "c-1", "gpt-test", 7, "a\xff", Finish::kLength, Usage{1, 2}));
  EXPECT_EQ(j["choices"][0]["message"]["content"], "a\xef\xbf\xbd");
  j = nlohmann::json::parse(modelsBody(kModel, 5));
  EXPECT_EQ(j["data"][0]["id"], "gpt-test");
  EXPECT_EQ(j["data"][0]["context_length"], 64);
}

// Pushes `text` byte by byte: what each push released.
std::vector<std::string> pushAll(TextStream& s, const std::string& text) {
  std::vector<std::string> out;
  for (const char c : text) out.push_back(s.push(c));
  return out;
}

TEST(TextStreamTest, StopStringsCutTheTextAndTheirPrefixesAreHeldBack) {
  TextStream s({"END", "\n\n"});
  std::string sent;
  for (const std::string& p : pushAll(s, "abEN")) sent += p;
  EXPECT_EQ(sent, "ab");  // "EN" may still become "END"
  sent += s.push('x');    // it did not
  EXPECT_EQ(sent, "abENx");
  EXPECT_FALSE(s.stopped());
  sent += s.push('E');
  sent += s.push('N');
  sent += s.push('D');
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(sent, "abENx");
  EXPECT_EQ(s.push('y'), "");  // nothing after the stop
  EXPECT_EQ(s.finish(), "");
  EXPECT_EQ(s.generated(), 8);

  TextStream t({"\n\n"});
  std::string got;
  for (const std::string& p : pushAll(t, "one\ntwo\n")) got += p;
  got += t.finish();  // the held "\n" comes at the end
  EXPECT_EQ(got, "one\ntwo\n");
  EXPECT_FALSE(t.stopped());
}

TEST(TextStreamTest, AUtf8CharacterIsSentWhole) {
  TextStream s({});
  EXPECT_EQ(s.push('a'), "a");
  EXPECT_EQ(s.push('\xc3'), "");  // é's first byte
  EXPECT_EQ(s.push('\xa9'), "\xc3\xa9");
  EXPECT_EQ(s.push('\xe2'), "");  // €
  EXPECT_EQ(s.push('\x82'), "");
  EXPECT_EQ(s.push('\xac'), "\xe2\x82\xac");
  EXPECT_EQ(s.push('\xc3'), "");
  EXPECT_EQ(s.push('z'), "\xc3z");  // not a character after all: released as it is
  EXPECT_EQ(s.push('\xf0'), "");
  EXPECT_EQ(s.finish(), "\xf0");
}

}  // namespace
}  // namespace tandem::serve

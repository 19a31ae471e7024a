#include "serve/completion.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace tandem::serve {

using nlohmann::json;

namespace {

constexpr int kMaxDepth = 32;  // nesting of a request's JSON (a chat is 3 deep)
constexpr size_t kMaxStops = 4;

ApiError invalid(const std::string& param, const std::string& message) {
  return ApiError(400, "invalid_request_error", param, message);
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Refuses JSON nested deeper than kMaxDepth before it is parsed (a megabyte of '[' would
// otherwise build a value a million levels deep).
void checkDepth(std::string_view body) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth)
        throw invalid("", "the request's JSON is nested deeper than " + std::to_string(kMaxDepth) +
                              " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

int64_t integer(const json& v, const std::string& name, int64_t least, int64_t most) {
  if (!v.is_number_integer())
    throw invalid(name, "'" + name + "' must be an integer, got " + dump(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(most))
    throw invalid(name,
                  "'" + name + "' must be at most " + std::to_string(most) + ", got " + dump(v));
  const auto x = v.get<int64_t>();
  if (x < least || x > most)
    throw invalid(name, "'" + name + "' must be in [" + std::to_string(least) + ", " +
                            std::to_string(most) + "], got " + dump(v));
  return x;
}

double number(const json& v, const std::string& name, double least, double most) {
  if (!v.is_number()) throw invalid(name, "'" + name + "' must be a number, got " + dump(v));
  const auto x = v.get<double>();
  if (!(x >= least && x <= most))
    throw invalid(name, "'" + name + "' must be in [" + std::to_string(least) + ", " +
                            std::to_string(most) + "], got " + dump(v));
  return x;
}

bool boolean(const json& v, const std::string& name) {
  if (!v.is_boolean()) throw invalid(name, "'" + name + "' must be true or false, got " + dump(v));
  return v.get<bool>();
}

std::vector<std::string> stops(const json& v) {
  std::vector<std::string> out;
  if (v.is_null()) return out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array() && v.size() <= kMaxStops) {
    for (const json& s : v) {
      if (!s.is_string()) throw invalid("stop", "each 'stop' must be a string, got " + dump(s));
      out.push_back(s.get<std::string>());
    }
  } else {
    throw invalid("stop", "'stop' must be a string or a list of at most " +
                              std::to_string(kMaxStops) + " strings");
  }
  for (const std::string& s : out)
    if (s.empty()) throw invalid("stop", "a 'stop' string is empty");
  return out;
}

// A field accepted for compatibility that must keep its no-op value (`ok`).
void onlyDefault(const json& v, const std::string& name, bool ok) {
  if (!ok) throw invalid(name, "'" + name + "' " + dump(v) + " is not supported (leave it out)");
}

std::string promptOf(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array() && v.size() == 1 && v[0].is_string()) return v[0].get<std::string>();
  throw invalid("prompt", "'prompt' must be a string (or a list of one string)");
}

}  // namespace

std::string errorBody(const ApiError& e) {
  json err{{"message", e.what()}, {"type", e.type}, {"code", nullptr}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  return dump(json{{"error", err}});
}

CompletionRequest parseCompletion(std::string_view body, bool chat, const ServedModel& model) {
  checkDepth(body);
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    throw invalid("", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw invalid("", "the body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;
  r.sampling.temperature = 1.0f;
  std::optional<int64_t> max_tokens;
  bool have_prompt = false;
  for (const auto& [key, v] : j.items()) {
    if (key == "model") {
      if (!v.is_string()) throw invalid(key, "'model' must be a string");
      if (v.get<std::string>() != model.name)
        throw ApiError(404, "invalid_request_error", key,
                       "the model '" + v.get<std::string>() + "' is not served here; this " +
                           "server serves '" + model.name + "'");
    } else if (!chat && key == "prompt") {
      r.prompt = promptOf(v);
      have_prompt = true;
    } else if (chat && key == "messages") {
      r.prompt = renderChat(v.dump());
      have_prompt = true;
    } else if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
      if (!v.is_null()) max_tokens = integer(v, key, 1, model.context);
    } else if (key == "temperature") {
      if (!v.is_null()) r.sampling.temperature = static_cast<float>(number(v, key, 0, 2));
    } else if (key == "top_p") {
      if (!v.is_null()) r.sampling.top_p = static_cast<float>(number(v, key, 0, 1));
      if (!(r.sampling.top_p > 0)) throw invalid(key, "'top_p' must be above 0");
    } else if (key == "top_k") {
      if (!v.is_null()) r.sampling.top_k = integer(v, key, 0, std::numeric_limits<int32_t>::max());
    } else if (key == "seed") {
      if (!v.is_null()) {
        r.sampling.seed = static_cast<uint64_t>(integer(v, key, std::numeric_limits<int64_t>::min(),
                                                        std::numeric_limits<int64_t>::max()));
        r.seeded = true;
      }
    } else if (key == "stop") {
      r.stop = stops(v);
    } else if (key == "stream") {
      if (!v.is_null()) r.stream = boolean(v, key);
    } else if (key == "stream_options") {
      if (v.is_null()) continue;
      if (!v.is_object()) throw invalid(key, "'stream_options' must be an object");
      for (const auto& [k, x] : v.items()) {
        if (k != "include_usage") throw invalid(key, "'stream_options' has no field '" + k + "'");
        r.include_usage = boolean(x, "stream_options.include_usage");
      }
    } else if (key == "n" || key == "best_of") {
      onlyDefault(v, key, v.is_null() || (v.is_number_integer() && v.get<int64_t>() == 1));
    } else if (key == "user") {
      if (!v.is_string() && !v.is_null()) throw invalid(key, "'user' must be a string");
    } else if (key == "presence_penalty" || key == "frequency_penalty") {
      onlyDefault(v, key, v.is_null() || (v.is_number() && v.get<double>() == 0));
    } else if (key == "logprobs" || key == "echo" || key == "logit_bias" || key == "suffix") {
      onlyDefault(v, key,
                  v.is_null() || v == false || (v.is_object() && v.empty()) ||
                      (key == "suffix" && v.is_string() && v.get<std::string>().empty()));
    } else {
      throw invalid(key, "unknown field '" + key + "'");
    }
  }
  if (!have_prompt)
    throw invalid(chat ? "messages" : "prompt",
                  std::string("'") + (chat ? "messages" : "prompt") + "' is missing");
  if (r.include_usage && !r.stream)
    throw invalid("stream_options", "'stream_options' is only for 'stream': true");
  const auto length = static_cast<int64_t>(r.prompt.size());
  if (length == 0) throw invalid(chat ? "messages" : "prompt", "the prompt is empty");
  const int64_t room = model.context - length;
  if (room < 1)
    throw invalid(chat ? "messages" : "prompt",
                  "the prompt is " + std::to_string(length) + " tokens; the model's context is " +
                      std::to_string(model.context) + " and leaves none to generate");
  r.max_tokens = max_tokens ? *max_tokens : std::min<int64_t>(room, chat ? 256 : 16);
  if (r.max_tokens > room)
    throw invalid("max_tokens", "a prompt of " + std::to_string(length) + " tokens and " +
                                    std::to_string(r.max_tokens) +
                                    " new ones exceed the model's context of " +
                                    std::to_string(model.context) + " tokens");
  return r;
}

std::string renderChat(std::string_view messages_json) {
  const json messages = json::parse(messages_json.begin(), messages_json.end(), nullptr, false);
  if (!messages.is_array() || messages.empty())
    throw invalid("messages", "'messages' must be a non-empty list");
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw invalid(at, at + " must be an object");
    std::string role, content;
    for (const auto& [key, v] : m.items()) {
      if (key == "role" && v.is_string()) {
        role = v.get<std::string>();
      } else if (key == "content" && v.is_string()) {
        content = v.get<std::string>();
      } else if (key == "name" && v.is_string()) {
        continue;
      } else {
        throw invalid(at, at + "." + key + " is not a string role, content or name");
      }
    }
    if (role != "system" && role != "user" && role != "assistant")
      throw invalid(at, at + " has role '" + role + "'; system, user or assistant are served");
    out += "<|" + role + "|>\n" + content + "\n";
  }
  return out + "<|assistant|>\n";
}

const char* finishName(Finish f) { return f == Finish::kStop ? "stop" : "length"; }

namespace {

json usageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

json head(const CompletionRequest& r, const std::string& id, const std::string& model,
          int64_t created, bool chunk) {
  const char* object =
      r.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}

}  // namespace

std::string completionBody(const CompletionRequest& r, const std::string& id,
                           const std::string& model, int64_t created, const std::string& text,
                           Finish finish, const Usage& usage) {
  json out = head(r, id, model, created, false);
  json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finishName(finish)}};
  if (r.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  out["choices"] = json::array({choice});
  out["usage"] = usageJson(usage);
  return dump(out);
}

std::string chunkBody(const CompletionRequest& r, const std::string& id, const std::string& model,
                      int64_t created, const std::string& text, std::optional<Finish> finish,
                      bool first, const Usage* usage) {
  json out = head(r, id, model, created, true);
  if (usage) {
    out["choices"] = json::array();
    out["usage"] = usageJson(*usage);
    return dump(out);
  }
  json choice{{"index", 0}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish ? json(finishName(*finish)) : json(nullptr);
  if (r.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || !finish) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  out["choices"] = json::array({choice});
  return dump(out);
}

std::string modelsBody(const ServedModel& model, int64_t created) {
  const json m{{"id", model.name},
               {"object", "model"},
               {"created", created},
               {"owned_by", "tandem"},
               {"context_length", model.context}};
  return dump(json{{"object", "list"}, {"data", json::array({m})}});
}

namespace {

// Bytes at the end of `s` that begin a UTF-8 character not yet complete.
size_t incompleteCharacter(const std::string& s) {
  size_t back = 0;
  while (back < 3 && back < s.size() &&
         (static_cast<unsigned char>(s[s.size() - 1 - back]) & 0xC0) == 0x80)
    ++back;
  if (back == s.size()) return 0;
  const auto lead = static_cast<unsigned char>(s[s.size() - 1 - back]);
  const size_t need = lead >= 0xF0 && lead < 0xF8   ? 4
                      : lead >= 0xE0 && lead < 0xF0 ? 3
                      : lead >= 0xC0 && lead < 0xE0 ? 2
                                                    : 1;
  return back + 1 < need ? back + 1 : 0;
}

}  // namespace

std::string TextStream::push(char byte) {
  if (stopped_) return {};
  text_.push_back(byte);
  // A stop string can only begin where the text not yet sent begins or later (a prefix
  // of one at the end is held back below).
  size_t at = std::string::npos;
  for (const std::string& s : stop_) at = std::min(at, text_.find(s, sent_));
  if (at != std::string::npos) {
    stopped_ = true;
    std::string out = text_.substr(sent_, at - sent_);
    sent_ = text_.size();
    return out;
  }
  size_t hold = incompleteCharacter(text_);
  for (const std::string& s : stop_)
    for (size_t k = std::min(s.size() - 1, text_.size() - sent_); k > hold; --k)
      if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  const size_t end = std::max(sent_, text_.size() - std::min(hold, text_.size()));
  std::string out = text_.substr(sent_, end - sent_);
  sent_ = end;
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return {};
  std::string out = text_.substr(sent_);
  sent_ = text_.size();
  return out;
}

}  // namespace tandem::serve

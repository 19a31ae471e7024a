#include "serve/api.h"

#include <sodium.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <ctime>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include "core/error.h"

namespace tandem::serve {

std::vector<std::string> readApiKeys(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw IoError("cannot read the API key file '" + path + "'");
  struct stat st {};
  TANDEM_CHECK_MSG(::stat(path.c_str(), &st) == 0 && (st.st_mode & 077) == 0, InvalidArgument,
                   "the API key file '" << path << "' may be read by others than its owner "
                                        << "(chmod 600 it)");
  std::vector<std::string> keys;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
      line.pop_back();
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#') continue;
    const std::string key = line.substr(start);
    bool printable = key.size() >= 16 && key.size() <= 256;
    for (const char c : key) printable = printable && c > 0x20 && c < 0x7F;
    TANDEM_CHECK_MSG(printable, InvalidArgument,
                     path << ":" << n << ": an API key is 16 to 256 printable characters "
                          << "without spaces");
    keys.push_back(key);
  }
  TANDEM_CHECK_MSG(!keys.empty(), InvalidArgument,
                   "the API key file '" << path << "' holds no key");
  return keys;
}

namespace {

std::array<unsigned char, 32> keyHash(std::string_view key) {
  std::array<unsigned char, 32> h{};
  crypto_generichash(h.data(), h.size(), reinterpret_cast<const unsigned char*>(key.data()),
                     key.size(), nullptr, 0);
  return h;
}

std::string routeOf(std::string_view target) {
  const size_t q = target.find('?');
  return std::string(target.substr(0, q));
}

}  // namespace

Api::Api(Engine& engine, ApiOptions options) : engine_(engine), options_(std::move(options)) {
  TANDEM_CHECK_MSG(sodium_init() >= 0, Error, "libsodium could not start");
  for (const std::string& k : options_.keys) key_hashes_.push_back(keyHash(k));
}

bool Api::authorized(const Request& req) const {
  if (key_hashes_.empty()) return true;
  const auto it = req.find(http::field::authorization);
  if (it == req.end()) return false;
  std::string_view v(it->value().data(), it->value().size());
  if (v.size() < 7 || !(v.substr(0, 7) == "Bearer " || v.substr(0, 7) == "bearer ")) return false;
  v.remove_prefix(7);
  // Hashed first, so every comparison is of 32 bytes; each key compared, whatever matched.
  const std::array<unsigned char, 32> h = keyHash(v);
  int matched = 0;
  for (const auto& k : key_hashes_) matched |= sodium_memcmp(h.data(), k.data(), h.size()) == 0;
  return matched != 0;
}

net::awaitable<bool> Api::answer(Request& req, Connection& c, const std::string& route,
                                 const Plain& plain) {
  metrics_.request(route, static_cast<int>(plain.status));
  Response r = respond(req, plain.status, plain.type, plain.body);
  if (plain.status == http::status::too_many_requests ||
      plain.status == http::status::service_unavailable)
    r.set(http::field::retry_after, "1");
  if (plain.status == http::status::unauthorized) r.set(http::field::www_authenticate, "Bearer");
  const bool sent = co_await c.send(r);
  co_return sent;
}

namespace {

std::string errorOf(int status, const char* type, const std::string& message) {
  return errorBody(ApiError(status, type, "", message));
}

}  // namespace

std::optional<Plain> Api::route(const Request& req, const std::string& route) const {
  struct Route {
    const char* path;
    http::verb verb;
  };
  static const Route kRoutes[] = {{"/health", http::verb::get},
                                  {"/metrics", http::verb::get},
                                  {"/v1/models", http::verb::get},
                                  {"/v1/completions", http::verb::post},
                                  {"/v1/chat/completions", http::verb::post}};
  const Route* known = nullptr;
  for (const Route& r : kRoutes)
    if (route == r.path) known = &r;
  if (!known)
    return Plain{http::status::not_found,
                 errorOf(404, "invalid_request_error", "no route " + route)};
  if (req.method() != known->verb)
    return Plain{http::status::method_not_allowed,
                 errorOf(405, "invalid_request_error",
                         route + " takes " + std::string(http::to_string(known->verb)) + " only")};
  if (route == "/health") {
    const std::optional<std::string> failed = engine_.failure();
    if (failed)
      return Plain{http::status::service_unavailable, errorOf(503, "server_error", *failed)};
    return Plain{http::status::ok, "{\"status\":\"ok\"}"};
  }
  if (!authorized(req))
    return Plain{http::status::unauthorized,
                 errorOf(401, "invalid_request_error",
                         "a valid API key is needed: send 'Authorization: Bearer KEY'")};
  if (route == "/metrics")
    return Plain{http::status::ok,
                 metrics_.text(engine_.queued(), engine_.running()) +
                     (options_.stages ? options_.stages->text() : std::string()),
                 "text/plain; version=0.0.4"};
  if (route == "/v1/models")
    return Plain{http::status::ok, modelsBody(options_.model, options_.created)};
  return std::nullopt;  // a completion
}

net::awaitable<bool> Api::handle(Request& req, Connection& c) {
  const std::string route = routeOf(std::string_view(req.target().data(), req.target().size()));
  const std::optional<Plain> plain = this->route(req, route);
  if (plain) {
    const std::string label = plain->status == http::status::not_found ? "other" : route;
    const bool kept = co_await answer(req, c, label, *plain);
    co_return kept;
  }
  const bool kept = co_await complete(req, c, route == "/v1/chat/completions", route);
  co_return kept;
}

net::awaitable<bool> Api::complete(Request& req, Connection& c, bool chat,
                                   const std::string& route) {
  CompletionRequest r;
  std::vector<int32_t> prompt;  // the request's text as the model's tokens
  std::optional<Plain> refused;
  try {
    r = parseCompletion(req.body(), chat, options_.model);
    prompt = options_.codec.encode(r.prompt);
    for (size_t i = 0; i < prompt.size(); ++i)
      if (prompt[i] >= options_.vocab)
        throw ApiError(400, "invalid_request_error", chat ? "messages" : "prompt",
                       "the prompt's token " + std::to_string(prompt[i]) + " at " +
                           std::to_string(i) + " is outside the model's vocab of " +
                           std::to_string(options_.vocab));
    // The parser counted bytes; a tokenizer's tokens are fewer, but may add a BOS.
    if (static_cast<int64_t>(prompt.size()) + r.max_tokens > options_.model.context)
      throw ApiError(400, "invalid_request_error", "max_tokens",
                     "a prompt of " + std::to_string(prompt.size()) + " tokens and " +
                         std::to_string(r.max_tokens) + " new ones exceed the model's context of " +
                         std::to_string(options_.model.context) + " tokens");
  } catch (const ApiError& e) {
    refused = Plain{static_cast<http::status>(e.status), errorBody(e)};
  }
  const std::optional<std::string> failed = engine_.failure();
  if (!refused && failed)
    refused = Plain{http::status::service_unavailable, errorOf(503, "server_error", *failed)};
  std::shared_ptr<Ticket> ticket;
  const auto prompt_tokens = static_cast<int64_t>(prompt.size());
  if (!refused) {
    if (!r.seeded)
      r.sampling.seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    std::shared_ptr<Waker> waker = c.waker();
    ticket =
        engine_.submit(std::move(prompt), r.max_tokens, r.sampling, [waker] { waker->wake(); });
    if (!ticket)
      refused = Plain{http::status::too_many_requests,
                      errorBody(ApiError(429, "rate_limit_exceeded", "",
                                         "every place is taken (sequences in flight and the "
                                         "queue): retry"))};
  }
  if (refused) {
    const bool kept = co_await answer(req, c, route, *refused);
    co_return kept;
  }
  struct CancelOnExit {  // a client that leaves, or a server that stops, ends its sequence
    std::shared_ptr<Ticket> t;
    ~CancelOnExit() { t->cancel(); }
  } cancel_on_exit{ticket};
  Generated g = co_await generated(r, c, *ticket, chat ? "chatcmpl-" : "cmpl-");
  if (g.client_gone) {
    metrics_.request(route, 499);  // (nginx's "client closed request")
    co_return false;
  }
  metrics_.tokens(prompt_tokens, g.tokens);
  const Usage usage{prompt_tokens, g.tokens};
  if (!r.stream) {
    const Plain whole =
        g.failure.empty()
            ? Plain{http::status::ok, completionBody(r, g.id, options_.model.name, g.created,
                                                     g.text, g.finish, usage)}
            : Plain{http::status::service_unavailable, errorOf(503, "server_error", g.failure)};
    const bool kept = co_await answer(req, c, route, whole);
    co_return kept;
  }
  metrics_.request(route, 200);
  std::vector<std::string> last;
  if (!g.failure.empty()) {
    last.push_back(errorOf(503, "server_error", g.failure));
  } else {
    last.push_back(chunkBody(r, g.id, options_.model.name, g.created, "", g.finish, g.first));
    if (r.include_usage)
      last.push_back(
          chunkBody(r, g.id, options_.model.name, g.created, "", std::nullopt, false, &usage));
  }
  last.push_back("[DONE]");
  for (const std::string& e : last)
    if (!co_await c.event(e)) co_return false;
  const bool ended = co_await c.endEvents();
  co_return ended;
}

net::awaitable<Api::Generated> Api::generated(const CompletionRequest& r, Connection& c,
                                              Ticket& ticket, const char* prefix) {
  Generated g;
  g.id = prefix + std::to_string(++next_id_);
  g.created = static_cast<int64_t>(std::time(nullptr));
  if (r.stream && !co_await c.beginEvents()) {
    g.client_gone = true;
    co_return g;
  }
  TextStream text(r.stop);
  double last_at = 0;
  bool end_token = false;  // the model's end-of-text token came: the text ends as at a stop
  for (;;) {
    const Ticket::Taken t = ticket.take();
    std::string piece;
    for (size_t i = 0; i < t.tokens.size() && !text.stopped() && !end_token; ++i) {
      if (g.tokens == 0) {
        metrics_.firstToken(t.at_s[i]);
      } else {
        metrics_.interToken(t.at_s[i] - last_at);
      }
      last_at = t.at_s[i];
      ++g.tokens;
      end_token = options_.codec.ends(t.tokens[i]);  // counted, but not text
      if (end_token) break;
      for (const char byte : options_.codec.tokenText(t.tokens[i])) piece += text.push(byte);
    }
    const bool done = text.stopped() || end_token || t.ended;
    if (text.stopped() || end_token) ticket.cancel();
    if (end_token && !text.stopped()) piece += text.finish();
    if (t.ended && !text.stopped() && !end_token) {
      g.failure = t.error;
      piece += text.finish();
    }
    if (r.stream && !piece.empty()) {
      const std::string chunk =
          chunkBody(r, g.id, options_.model.name, g.created, piece, std::nullopt, g.first);
      if (!co_await c.event(chunk)) {
        g.client_gone = true;
        co_return g;
      }
      g.first = false;
    } else {
      g.text += piece;
    }
    if (done) break;
    co_await c.wait();
    if (c.clientGone()) {
      g.client_gone = true;
      co_return g;
    }
  }
  g.finish = text.stopped() || end_token ? Finish::kStop : Finish::kLength;
  co_return g;
}

}  // namespace tandem::serve

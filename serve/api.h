// The routes of `tandem serve` (docs/serve.md):
//   POST /v1/completions, POST /v1/chat/completions   (whole, or streamed as SSE)
//   GET /v1/models, GET /metrics, GET /health
// Every route but /health asks for `Authorization: Bearer KEY` when keys are given, each
// compared in constant time (libsodium) with every key. A completion is a ticket on the
// engine: its tokens (bytes) become text through a TextStream (stop strings, whole UTF-8
// characters), streamed as they come or answered at the end; a client that leaves, or a
// stop string, cancels its sequence. Beyond the engine's places: 429 with Retry-After.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hf/text_codec.h"
#include "serve/completion.h"
#include "serve/engine.h"
#include "serve/http_server.h"
#include "serve/metrics.h"

namespace tandem::serve {

// The API keys a server accepts: each line of a key file that is not blank or a comment
// ('#'), 16 to 256 printable characters without spaces. IoError if the file cannot be
// read; InvalidArgument naming the file and line for a bad key, for no key at all, or if
// others than its owner may read it.
std::vector<std::string> readApiKeys(const std::string& path);

// An answer other than a completion: status, body and content type.
struct Plain {
  http::status status = http::status::ok;
  std::string body;
  const char* type = "application/json";
};

struct ApiOptions {
  ServedModel model;
  int64_t vocab = 256;                 // tokens the model takes (a prompt's ids must be below)
  hf::TextCodec codec;                 // text <-> ids: the model's tokenizer, or bytes
  std::vector<std::string> keys;       // empty: no key asked
  int64_t created = 0;                 // the model's time, for /v1/models (Unix seconds)
  const StageLoads* stages = nullptr;  // the pipeline's stages' loads, for /metrics
};

class Api {
 public:
  Api(Engine& engine, ApiOptions options);
  // The server's handler.
  net::awaitable<bool> handle(Request& req, Connection& c);
  const Metrics& metrics() const { return metrics_; }

 private:
  // What a completion generated, as its session saw it.
  struct Generated {
    std::string id, text, failure;
    int64_t created = 0, tokens = 0;
    Finish finish = Finish::kLength;
    bool first = true;  // no chunk streamed yet
    bool client_gone = false;
  };
  // The plain answer for `route`, or none for a completion.
  std::optional<Plain> route(const Request& req, const std::string& route) const;
  net::awaitable<bool> complete(Request& req, Connection& c, bool chat, const std::string& route);
  // Takes the ticket's tokens until it ends (streaming each piece of text when asked).
  net::awaitable<Generated> generated(const CompletionRequest& r, Connection& c, Ticket& ticket,
                                      const char* prefix);
  net::awaitable<bool> answer(Request& req, Connection& c, const std::string& route,
                              const Plain& plain);
  bool authorized(const Request& req) const;

  Engine& engine_;
  ApiOptions options_;
  std::vector<std::array<unsigned char, 32>> key_hashes_;
  Metrics metrics_;
  int64_t next_id_ = 0;
};

}  // namespace tandem::serve

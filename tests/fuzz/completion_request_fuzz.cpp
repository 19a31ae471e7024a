// libFuzzer target for `tandem serve`'s request parser (what any HTTP client sends): the
// body, as a completion and as a chat completion, must either parse into a request within
// every bound (a prompt that fits the context with its max_tokens, sampling in range, at
// most 4 non-empty stops) whose answers are valid JSON, or raise ApiError with a valid JSON
// error body. Anything else (a crash, a sanitizer report, another exception) is a bug.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "serve/completion.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::serve;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const ServedModel model{"m", 64};
  for (const bool chat : {false, true}) {
    CompletionRequest r;
    try {
      r = parseCompletion(body, chat, model);
    } catch (const ApiError& e) {
      if (!nlohmann::json::accept(errorBody(e))) std::abort();
      continue;
    }
    const auto length = static_cast<int64_t>(r.prompt.size());
    if (length < 1 || r.max_tokens < 1 || length + r.max_tokens > model.context) std::abort();
    if (!(r.sampling.temperature >= 0 && r.sampling.temperature <= 2)) std::abort();
    if (!(r.sampling.top_p > 0 && r.sampling.top_p <= 1) || r.sampling.top_k < 0) std::abort();
    if (r.stop.size() > 4) std::abort();
    for (const std::string& s : r.stop)
      if (s.empty()) std::abort();
    const Usage u{length, r.max_tokens};
    if (!nlohmann::json::accept(
            completionBody(r, "id", model.name, 1, r.prompt, Finish::kStop, u)) ||
        !nlohmann::json::accept(chunkBody(r, "id", model.name, 1, r.prompt, std::nullopt, true)))
      std::abort();
    TextStream text(r.stop);
    for (const char c : r.prompt) text.push(c);
    text.finish();
  }
  return 0;
}

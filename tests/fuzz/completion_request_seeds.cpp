// Writes a seed corpus of completion and chat requests for completion_request_fuzz into the
// directory given as the only argument.
#include <cstdio>
#include <fstream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const char* seeds[] = {
      R"({"prompt": "Once upon", "max_tokens": 8})",
      R"({"model": "m", "prompt": ["a"], "max_tokens": 4, "temperature": 0.7, "top_p": 0.9,
          "top_k": 20, "seed": 5, "stop": ["\n", "."], "stream": true,
          "stream_options": {"include_usage": true}, "n": 1, "user": "x"})",
      R"({"messages": [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "Hi", "name": "a"}],
          "max_completion_tokens": 5, "stream": false})",
      R"({"prompt": "\u00e9\ud83d\ude00", "stop": "\u00e9", "logprobs": null, "echo": false})",
  };
  int n = 0;
  for (const char* s : seeds)
    std::ofstream(std::string(argv[1]) + "/seed-" + std::to_string(n++)) << s;
  return 0;
}

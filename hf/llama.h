// Hugging Face Llama-architecture folders (model_type llama, mistral, qwen2): config.json and
// safetensors weights in, as a tandem model of `llama` blocks —
//   embedding {vocab, dim}, llama x num_hidden_layers, rmsnorm, linear {out: vocab, bias: false}
// — and such a model back out as a folder transformers can load (config.json,
// model.safetensors). The fused attention projection is the rows of q_proj, k_proj and
// v_proj in that order; a tied head (tie_word_embeddings) is imported as a copy of the
// embedding table.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/layers/rope.h"
#include "core/model_file.h"

namespace tandem::hf {

struct LlamaConfig {
  std::string model_type = "llama";
  int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, layers = 0, vocab = 0;
  int64_t max_positions = 0;
  double eps = 1e-6;
  RopeSpec rope;  // theta (default 10000) and scaling
  bool tie_embeddings = false;
  bool qkv_bias = false, out_bias = false;  // Llama's attention_bias sets both; Qwen2 the first
  // eos_token_id (an id, a list of them, or absent/null: none): the tokens that end a
  // generated text. generation_config.json's, where the folder has one, is taken over it
  // (as transformers' generate does).
  std::vector<int64_t> eos_ids;
};

// The end-of-text ids of `field` in a JSON object (an id or a list of them; absent or
// null: none), each in [0, vocab); FormatError "<label>: field 'eos_token_id' ..." else.
std::vector<int64_t> parseEosIds(std::string_view json, const std::string& label, int64_t vocab);

// config.json's text; FormatError "<label>: field '<name>' ..." for a missing or bad
// field, Unsupported for a model this importer does not express (another architecture,
// another activation, dynamic or yarn rope scaling, a sliding window).
LlamaConfig parseLlamaConfig(std::string_view json, const std::string& label);
// The config.json transformers reads back (LlamaForCausalLM, or the architecture's own),
// its torch_dtype that of the weights written beside it ("float32", "float16", "bfloat16").
std::string llamaConfigJson(const LlamaConfig& config, const std::string& torch_dtype = "float32");

// The tandem model of a config over sequences of `context` tokens.
ModelSpec llamaModelSpec(const LlamaConfig& config, int64_t context, const std::string& name);
// A model spec's config back (InvalidArgument if its layers are not that form).
LlamaConfig llamaConfigOf(const ModelSpec& spec);

// What importing DIR writes: the model, each parameter filled from the folder's tensors
// (every tensor's shape checked against config.json before any value is read: FormatError
// naming the tensor), and the metadata importLlama's file carries. The fills read the
// folder's mapped files, which they keep open. writeModelFile(path, spec, params,
// metadata) writes it without holding the weights twice (what `tandem import` does).
struct LlamaImport {
  ModelSpec spec;
  std::vector<ParamFill> params;
  std::map<std::string, AttrValue> metadata;
};
LlamaImport planLlamaImport(const std::string& dir, int64_t context = 0);

// Reads DIR/config.json and the weights (model.safetensors or its shards) as a model
// file: every tensor the config implies, checked against its shape (FormatError naming the
// tensor); context 0 takes max_position_embeddings, capped at 4096 (the cache per
// sequence is sized by it). DIR/tokenizer.json, when tokenizer.h reads it, goes into the
// metadata as "tokenizer"; one it does not is named in "tokenizer_note".
ModelFile importLlama(const std::string& dir, int64_t context = 0);

// Writes a model file of that form as DIR/config.json and DIR/model.safetensors with
// Hugging Face's tensor names, in dtype F32, F16 or BF16 (and DIR/tokenizer.json when the
// model carries one).
void exportLlama(const ModelFile& file, const std::string& dir, const std::string& dtype = "F32");

}  // namespace tandem::hf

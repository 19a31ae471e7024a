#include "hf/llama.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file.h"
#include "core/model.h"
#include "hf/safetensors.h"
#include "hf/tokenizer.h"

namespace tandem::hf {
namespace {

using Json = nlohmann::json;

[[noreturn]] void badField(const std::string& label, const std::string& field,
                           const std::string& what) {
  throw FormatError(label + ": field '" + field + "' " + what);
}

int64_t positive(const Json& root, const std::string& label, const char* field) {
  if (!root.contains(field)) badField(label, field, "is missing");
  const Json& v = root[field];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0)
    badField(label, field, "is " + v.dump() + ", not a positive integer");
  return v.get<int64_t>();
}

double number(const Json& root, const std::string& label, const char* field, double fallback) {
  if (!root.contains(field) || root[field].is_null()) return fallback;
  const Json& v = root[field];
  if (!v.is_number() || !(v.get<double>() > 0))
    badField(label, field, "is " + v.dump() + ", not a positive number");
  return v.get<double>();
}

bool boolean(const Json& root, const std::string& label, const char* field, bool fallback) {
  if (!root.contains(field) || root[field].is_null()) return fallback;
  if (!root[field].is_boolean())
    badField(label, field, "is " + root[field].dump() + ", not true or false");
  return root[field].get<bool>();
}

void readRopeScaling(const Json& root, const std::string& label, RopeSpec& rope) {
  if (!root.contains("rope_scaling") || root["rope_scaling"].is_null()) return;
  const Json& s = root["rope_scaling"];
  if (!s.is_object()) badField(label, "rope_scaling", "is not an object");
  const char* key = s.contains("rope_type") ? "rope_type" : "type";
  if (!s.contains(key) || !s[key].is_string())
    badField(label, "rope_scaling", "names no rope_type");
  const auto type = s[key].get<std::string>();
  if (type == "default") return;
  if (type != "linear" && type != "llama3")
    throw Unsupported(label + ": rope_scaling type '" + type +
                      "' is not supported (linear and llama3 are)");
  rope.scaling = type;
  rope.factor = number(s, label + " rope_scaling", "factor", 0);
  if (!(rope.factor > 0)) badField(label, "rope_scaling.factor", "is missing");
  if (type == "llama3") {
    rope.low_freq_factor = number(s, label + " rope_scaling", "low_freq_factor", 1);
    rope.high_freq_factor = number(s, label + " rope_scaling", "high_freq_factor", 4);
    rope.original_context =
        positive(s, label + " rope_scaling", "original_max_position_embeddings");
  }
}

std::string layerName(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

// One parameter of the model in order: its tandem name and shape, and the Hugging Face
// tensors whose rows it is (several for the fused attention projection).
struct ParamSource {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> tensors;
};

std::vector<ParamSource> paramSources(const LlamaConfig& c) {
  const int64_t d = c.hidden, hs = c.hidden / c.heads, kv = c.kv_heads * hs, f = c.intermediate;
  std::vector<ParamSource> out = {{"0.table", {c.vocab, d}, {"model.embed_tokens.weight"}}};
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string p = std::to_string(i + 1) + ".", hf = layerName(i);
    const std::string attn = hf + "self_attn.";
    out.push_back({p + "0.body.0.gamma", {d}, {hf + "input_layernorm.weight"}});
    out.push_back({p + "0.body.1.qkv.weight",
                   {d + 2 * kv, d},
                   {attn + "q_proj.weight", attn + "k_proj.weight", attn + "v_proj.weight"}});
    if (c.qkv_bias)
      out.push_back({p + "0.body.1.qkv.bias",
                     {d + 2 * kv},
                     {attn + "q_proj.bias", attn + "k_proj.bias", attn + "v_proj.bias"}});
    out.push_back({p + "0.body.1.out.weight", {d, d}, {attn + "o_proj.weight"}});
    if (c.out_bias) out.push_back({p + "0.body.1.out.bias", {d}, {attn + "o_proj.bias"}});
    out.push_back({p + "1.body.0.gamma", {d}, {hf + "post_attention_layernorm.weight"}});
    out.push_back({p + "1.body.1.gate.weight", {f, d}, {hf + "mlp.gate_proj.weight"}});
    out.push_back({p + "1.body.1.up.weight", {f, d}, {hf + "mlp.up_proj.weight"}});
    out.push_back({p + "1.body.1.down.weight", {d, f}, {hf + "mlp.down_proj.weight"}});
  }
  const std::string last = std::to_string(c.layers + 1) + ".";
  out.push_back({last + "gamma", {d}, {"model.norm.weight"}});
  out.push_back({std::to_string(c.layers + 2) + ".weight",
                 {c.vocab, d},
                 {c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight"}});
  return out;
}

std::string shapeText(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// What a model file imported from `dir` records: where it came from, the tokens that end a
// text (hf/text_codec.h; generation_config.json's, else config.json's) and the folder's
// tokenizer when tandem reads it (a note naming why not otherwise).
std::map<std::string, AttrValue> importMetadata(const std::string& dir, const LlamaConfig& c) {
  std::map<std::string, AttrValue> metadata;
  metadata["imported_from"] = std::string("huggingface");
  metadata["model_type"] = c.model_type;
  std::vector<int64_t> eos = c.eos_ids;
  const std::string generation_path = dir + "/generation_config.json";
  struct stat gst {};
  if (::stat(generation_path.c_str(), &gst) == 0) {
    const std::string text = readFile(generation_path, "generation config");
    if (Json::parse(text, nullptr, false).contains("eos_token_id"))
      eos = parseEosIds(text, generation_path, c.vocab);
  }
  if (!eos.empty()) metadata["eos_token_ids"] = eos;
  const std::string tokenizer_path = dir + "/tokenizer.json";
  struct stat st {};
  if (::stat(tokenizer_path.c_str(), &st) == 0) {
    std::string json = readFile(tokenizer_path, "tokenizer");
    try {
      const Tokenizer tokenizer = Tokenizer::parse(json, tokenizer_path);
      TANDEM_CHECK_MSG(tokenizer.vocabSize() <= c.vocab, FormatError,
                       tokenizer_path << " has " << tokenizer.vocabSize()
                                      << " tokens; the model's vocab_size is " << c.vocab);
      metadata["tokenizer"] = std::move(json);
    } catch (const Unsupported& e) {
      metadata["tokenizer_note"] = std::string(e.what()) + ": prompts and text are bytes";
    }
  }
  return metadata;
}

}  // namespace

LlamaConfig parseLlamaConfig(std::string_view json, const std::string& label) {
  const Json root = Json::parse(json, nullptr, false);
  if (root.is_discarded() || !root.is_object()) throw FormatError(label + ": not a JSON object");
  LlamaConfig c;
  if (!root.contains("model_type") || !root["model_type"].is_string())
    badField(label, "model_type", "is missing");
  c.model_type = root["model_type"].get<std::string>();
  if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2")
    throw Unsupported(label + ": model_type '" + c.model_type +
                      "' is not a Llama-architecture model (llama, mistral, qwen2)");
  if (root.contains("hidden_act") && root["hidden_act"] != "silu")
    throw Unsupported(label + ": hidden_act " + root["hidden_act"].dump() + " (only silu)");
  c.hidden = positive(root, label, "hidden_size");
  c.intermediate = positive(root, label, "intermediate_size");
  c.heads = positive(root, label, "num_attention_heads");
  c.kv_heads = root.contains("num_key_value_heads") && !root["num_key_value_heads"].is_null()
                   ? positive(root, label, "num_key_value_heads")
                   : c.heads;
  c.layers = positive(root, label, "num_hidden_layers");
  c.vocab = positive(root, label, "vocab_size");
  c.max_positions = positive(root, label, "max_position_embeddings");
  c.eps = number(root, label, "rms_norm_eps", 1e-6);
  c.rope.theta = number(root, label, "rope_theta", 10000);
  readRopeScaling(root, label, c.rope);
  c.tie_embeddings = boolean(root, label, "tie_word_embeddings", c.model_type == "qwen2");
  const bool attention_bias = boolean(root, label, "attention_bias", false);
  c.qkv_bias = c.model_type == "qwen2" || attention_bias;
  c.out_bias = attention_bias;
  if (c.hidden % c.heads != 0)
    badField(label, "num_attention_heads",
             std::to_string(c.heads) + " does not divide hidden_size " + std::to_string(c.hidden));
  if (c.heads % c.kv_heads != 0)
    badField(label, "num_key_value_heads",
             std::to_string(c.kv_heads) + " does not divide " + std::to_string(c.heads) +
                 " attention heads");
  if (root.contains("head_dim") && !root["head_dim"].is_null() &&
      positive(root, label, "head_dim") != c.hidden / c.heads)
    throw Unsupported(label + ": head_dim " + root["head_dim"].dump() +
                      " is not hidden_size / num_attention_heads");
  if ((c.hidden / c.heads) % 2 != 0)
    badField(label, "num_attention_heads", "gives heads of odd size: rotary embedding needs even");
  const bool sliding = boolean(root, label, "use_sliding_window", c.model_type == "mistral");
  if (sliding && root.contains("sliding_window") && !root["sliding_window"].is_null())
    throw Unsupported(label + ": a sliding attention window (" + root["sliding_window"].dump() +
                      ") is not supported");
  c.eos_ids = parseEosIds(json, label, c.vocab);
  return c;
}

std::vector<int64_t> parseEosIds(std::string_view json, const std::string& label, int64_t vocab) {
  const Json root = Json::parse(json, nullptr, false);
  if (root.is_discarded() || !root.is_object()) throw FormatError(label + ": not a JSON object");
  std::vector<int64_t> out;
  if (!root.contains("eos_token_id") || root["eos_token_id"].is_null()) return out;
  const Json& v = root["eos_token_id"];
  const Json ids = v.is_array() ? v : Json::array({v});
  for (const Json& id : ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab)
      badField(label, "eos_token_id",
               "holds " + id.dump() + ", not a token id in [0, " + std::to_string(vocab) + ")");
    out.push_back(id.get<int64_t>());
  }
  return out;
}

std::string llamaConfigJson(const LlamaConfig& c, const std::string& torch_dtype) {
  nlohmann::ordered_json j;
  const char* arch = c.model_type == "qwen2"     ? "Qwen2ForCausalLM"
                     : c.model_type == "mistral" ? "MistralForCausalLM"
                                                 : "LlamaForCausalLM";
  j["architectures"] = {arch};
  j["model_type"] = c.model_type;
  j["hidden_act"] = "silu";
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.intermediate;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["num_hidden_layers"] = c.layers;
  j["vocab_size"] = c.vocab;
  j["max_position_embeddings"] = c.max_positions;
  j["rms_norm_eps"] = c.eps;
  j["rope_theta"] = c.rope.theta;
  if (c.rope.scaling == "none") {
    j["rope_scaling"] = nullptr;
  } else {
    nlohmann::ordered_json s;
    s["rope_type"] = c.rope.scaling;
    s["factor"] = c.rope.factor;
    if (c.rope.scaling == "llama3") {
      s["low_freq_factor"] = c.rope.low_freq_factor;
      s["high_freq_factor"] = c.rope.high_freq_factor;
      s["original_max_position_embeddings"] = c.rope.original_context;
    }
    j["rope_scaling"] = s;
  }
  j["tie_word_embeddings"] = c.tie_embeddings;
  if (c.eos_ids.size() == 1) j["eos_token_id"] = c.eos_ids.front();
  if (c.eos_ids.size() > 1) j["eos_token_id"] = c.eos_ids;
  if (c.model_type != "qwen2") j["attention_bias"] = c.out_bias;
  if (c.model_type == "mistral") j["sliding_window"] = nullptr;
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

ModelSpec llamaModelSpec(const LlamaConfig& c, int64_t context, const std::string& name) {
  ModelSpec spec;
  spec.name = name;
  spec.input = Shape{context};
  spec.layers.push_back({"embedding", {{"vocab", c.vocab}, {"dim", c.hidden}}, {}, {}});
  LayerSpec block{"llama", {{"heads", c.heads}, {"mlp", c.intermediate}, {"eps", c.eps}}, {}, {}};
  if (c.kv_heads != c.heads) block.attrs["kv_heads"] = c.kv_heads;
  if (c.qkv_bias) block.attrs["qkv_bias"] = std::string("true");
  if (c.out_bias) block.attrs["out_bias"] = std::string("true");
  writeRope(c.rope, block);
  for (int64_t i = 0; i < c.layers; ++i) spec.layers.push_back(block);
  spec.layers.push_back({"rmsnorm", {{"eps", c.eps}}, {}, {}});
  spec.layers.push_back({"linear", {{"out", c.vocab}, {"bias", std::string("false")}}, {}, {}});
  return spec;
}

LlamaConfig llamaConfigOf(const ModelSpec& spec) {
  const Model model(spec);  // shapes checked, every field read by its layer
  const auto& layers = spec.layers;
  const auto bad = [&](const std::string& why) {
    throw InvalidArgument("model '" + spec.name + "' is not a Llama-architecture model: " + why);
  };
  if (layers.size() < 4 || layers.front().type != "embedding" ||
      layers[layers.size() - 2].type != "rmsnorm" || layers.back().type != "linear")
    bad("its layers are not embedding, llama blocks, rmsnorm, linear");
  LlamaConfig c;
  c.layers = static_cast<int64_t>(layers.size()) - 3;
  c.vocab = std::get<int64_t>(layers[0].attrs.at("vocab"));
  c.hidden = std::get<int64_t>(layers[0].attrs.at("dim"));
  c.max_positions = spec.input.numel();
  const LayerSpec& first = layers[1];
  for (int64_t i = 1; i <= c.layers; ++i)
    if (layers[static_cast<size_t>(i)].type != "llama" ||
        layers[static_cast<size_t>(i)].attrs != first.attrs)
      bad("layer " + std::to_string(i) + " is not a llama block like layer 1");
  const LayerSpec& head = layers.back();
  if (!head.attrs.count("bias") || std::get<std::string>(head.attrs.at("bias")) != "false")
    bad("its output head has a bias");
  SpecReader r(first);
  c.heads = r.integer("heads");
  c.kv_heads = r.integer("kv_heads", c.heads);
  c.intermediate = r.integer("mlp");
  c.eps = r.number("eps", 1e-6);
  c.qkv_bias = r.flag("qkv_bias", false);
  c.out_bias = r.flag("out_bias", false);
  c.rope = readRope(r);
  if (!c.rope.enabled()) bad("its attention has no rotary embedding");
  if (c.qkv_bias && !c.out_bias) c.model_type = "qwen2";
  return c;
}

LlamaImport planLlamaImport(const std::string& dir, int64_t context) {
  const std::string config_path = dir + "/config.json";
  const LlamaConfig c = parseLlamaConfig(readFile(config_path, "model config"), config_path);
  if (context == 0) context = std::min<int64_t>(c.max_positions, 4096);
  TANDEM_CHECK_MSG(context > 0 && context <= c.max_positions, InvalidArgument,
                   "a context of " << context << " tokens is outside the model's "
                                   << c.max_positions << " (max_position_embeddings)");
  auto weights = std::make_shared<SafetensorsFolder>(dir);
  std::string name =
      dir.substr(dir.find_last_of('/') == std::string::npos ? 0 : dir.find_last_of('/') + 1);
  if (name.empty()) name = c.model_type;
  LlamaImport out;
  out.spec = llamaModelSpec(c, context, name);
  for (const ParamSource& p : paramSources(c)) {
    const int64_t cols = p.shape.size() == 2 ? p.shape[1] : 0;
    int64_t rows = 0;
    for (const std::string& tensor : p.tensors) {
      const TensorEntry& e = weights->entry(tensor);
      const bool fits = cols == 0 ? e.shape.size() == 1 : e.shape.size() == 2 && e.shape[1] == cols;
      if (!fits || e.shape[0] > p.shape[0] - rows ||
          (p.tensors.size() == 1 && e.shape[0] != p.shape[0]))
        throw FormatError(
            dir + ": tensor '" + tensor + "' is " + shapeText(e.shape) + "; config.json implies " +
            (p.tensors.size() == 1 ? shapeText(p.shape) : "rows of " + std::to_string(cols)));
      rows += e.shape[0];
    }
    if (rows != p.shape[0])
      throw FormatError(dir + ": tensors " + p.tensors.front() + "... hold " +
                        std::to_string(rows * (cols ? cols : 1)) + " values; config.json implies " +
                        shapeText(p.shape));
    // The parameter's rows are its tensors' in order, each widened straight into place.
    auto fill = [weights, tensors = p.tensors](std::span<float> values) {
      size_t at = 0;
      for (const std::string& tensor : tensors) {
        const auto n = static_cast<size_t>(weights->entry(tensor).numel());
        weights->readFloats(tensor, values.subspan(at, n));
        at += n;
      }
    };
    // f32 tensors are stored as the model file holds them: the writer copies their bytes.
    std::vector<FileExtent> extents;
    for (const std::string& tensor : p.tensors)
      if (std::endian::native == std::endian::little && weights->entry(tensor).dtype == "F32")
        extents.push_back(weights->extent(tensor));
    if (extents.size() != p.tensors.size()) extents.clear();
    out.params.push_back({p.name, Shape(p.shape), std::move(fill), std::move(extents)});
  }
  out.metadata = importMetadata(dir, c);
  return out;
}

ModelFile importLlama(const std::string& dir, int64_t context) {
  const LlamaImport plan = planLlamaImport(dir, context);
  ModelFile file;
  file.spec = plan.spec;
  file.metadata = plan.metadata;
  for (const ParamFill& p : plan.params) {
    HostTensor t{p.name, p.shape, std::vector<float>(static_cast<size_t>(p.shape.numel()))};
    p.fill(t.data);
    file.params.push_back(std::move(t));
  }
  return file;
}

void exportLlama(const ModelFile& file, const std::string& dir, const std::string& dtype) {
  TANDEM_CHECK_MSG(dtype == "F32" || dtype == "F16" || dtype == "BF16", InvalidArgument,
                   "export dtype '" << dtype << "' is not F32, F16 or BF16");
  LlamaConfig c = llamaConfigOf(file.spec);
  if (const auto it = file.metadata.find("model_type"); it != file.metadata.end())
    if (const auto* s = std::get_if<std::string>(&it->second)) c.model_type = *s;
  c.tie_embeddings = false;  // the head is its own tensor here, whatever it was imported from
  if (const auto it = file.metadata.find("eos_token_ids"); it != file.metadata.end())
    if (const auto* ids = std::get_if<std::vector<int64_t>>(&it->second)) c.eos_ids = *ids;
  std::map<std::string, const HostTensor*> by_name;
  for (const HostTensor& t : file.params) by_name[t.name] = &t;
  std::vector<TensorData> out;
  for (const ParamSource& p : paramSources(c)) {
    const auto it = by_name.find(p.name);
    TANDEM_CHECK_MSG(it != by_name.end(), InvalidArgument,
                     "model '" << file.spec.name << "' has no parameter '" << p.name << "'");
    const HostTensor& t = *it->second;
    const int64_t cols = p.shape.size() == 2 ? p.shape[1] : 1;
    int64_t row = 0;
    for (const std::string& tensor : p.tensors) {
      // The fused projection splits back into q (hidden rows), then k and v (equal parts).
      int64_t rows = p.shape[0];
      if (p.tensors.size() == 3)
        rows = tensor == p.tensors[0] ? c.hidden : (p.shape[0] - c.hidden) / 2;
      const size_t begin = static_cast<size_t>(row * cols), n = static_cast<size_t>(rows * cols);
      TensorData d{tensor,
                   dtype,
                   cols == 1 && p.shape.size() == 1 ? std::vector<int64_t>{rows}
                                                    : std::vector<int64_t>{rows, cols},
                   {}};
      d.bytes.resize(n * (dtype == "F32" ? 4 : 2));
      for (size_t i = 0; i < n; ++i) {
        const float v = t.data[begin + i];
        if (dtype == "F32") {
          std::memcpy(d.bytes.data() + 4 * i, &v, 4);
        } else {
          const uint16_t h = dtype == "F16" ? floatToHalf(v) : floatToBFloat16(v);
          std::memcpy(d.bytes.data() + 2 * i, &h, 2);
        }
      }
      out.push_back(std::move(d));
      row += rows;
    }
  }
  writeSafetensors(dir + "/model.safetensors", out, {{"format", "pt"}});
  if (const auto it = file.metadata.find("tokenizer"); it != file.metadata.end())
    if (const auto* json = std::get_if<std::string>(&it->second))
      std::ofstream(dir + "/tokenizer.json") << *json;
  const std::string config = dir + "/config.json";
  checkWritable(config, "model config");
  std::ofstream(config) << llamaConfigJson(c, dtype == "F32"   ? "float32"
                                              : dtype == "F16" ? "float16"
                                                               : "bfloat16");
}

}  // namespace tandem::hf

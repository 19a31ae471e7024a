// Writes a seed corpus for onnx_import_fuzz into the directory given as the only
// argument: small models of every layer type tandem exports (so every import path has a
// valid start), each as `tandem export` writes it, and the PyTorch exports of the parity
// fixtures (tests/data/onnx-parity: the patterns and shape arithmetic PyTorch writes).
#include <onnx/onnx_pb.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "core/model_file.h"
#include "core/model_spec.h"
#include "onnx/onnx_export.h"

int main(int argc, char** argv) {
  using namespace tandem;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const char* const specs[] = {
      "input: [4]\nlayers: [{linear: {out: 3}}, relu, {dropout: {p: 0.5}}, {linear: {out: 2}}, "
      "sigmoid, tanh]\n",
      "input: [1, 4, 4]\nlayers: [{conv2d: {out: 2, kernel: 3, padding: 1}}, "
      "{maxpool2d: {kernel: 2}}, {avgpool2d: {kernel: 2, stride: 1}}, flatten, "
      "{linear: {out: 2, bias: false}}]\n",
      "input: [1, 4, 4]\nlayers: [{residual: {layers: [{conv2d: {out: 2, kernel: 3, stride: 2, "
      "padding: 1}}, gelu]}}, {residual: {layers: [relu]}}, globalavgpool, {linear: {out: 2}}]\n",
      "input: [3]\nlayers: [{embedding: {vocab: 5, dim: 2}}, layernorm, {residual: {layers: "
      "[{linear: {out: 2}}]}}, flatten, {residual: {layers: [{linear: {out: 3}}]}}]\n",
      "input: [3]\nlayers: [{embedding: {vocab: 5, dim: 4}}, {positional: {context: 4}}, "
      "{transformer: {heads: 2, mlp: 4}}, {attention: {heads: 1, causal: false}}, "
      "{linear: {out: 5}}]\n",
      "input: [2, 4, 4]\nlayers: [{conv2d: {out: 2, kernel: 1}}, relu6, {conv2d: {out: 2, "
      "kernel: 1}}, silu, hardswish, {residual: {layers: [{conv2d: {out: 2, kernel: 1}}, "
      "hardsigmoid]}}, flatten, {linear: {out: 2}}]\n",
      "input: [2, 3, 3]\nlayers: [{gate: {layers: [globalavgpool, {linear: {out: 1}}, relu, "
      "{linear: {out: 2}}, hardsigmoid]}}, flatten, {gate: {layers: [{linear: {out: 18}}, "
      "sigmoid]}}]\n",
      "input: [2, 4, 4]\nlayers: [batchnorm, {concat: {layers: [identity, {chain: {layers: "
      "[batchnorm, relu, {conv2d: {out: 2, kernel: 3, padding: 1}}]}}]}}, {residual: {proj_norm: "
      "true, layers: [{conv2d: {out: 3, kernel: 3, stride: 2, padding: 1}}]}}, flatten, "
      "{batchnorm: {momentum: 0.05}}]\n",
      "input: [4, 2, 2]\nlayers: [{concat: {layers: [{slice: {begin: 0, end: 2}}, {chain: "
      "{layers: [{slice: {begin: 2, end: 4}}, relu]}}]}}, {channel_shuffle: {groups: 2}}, "
      "flatten]\n"};
  int n = 0;
  for (const char* yaml : specs) {
    cpu::CpuBackend be(cpu::CpuOptions{1});
    Model model(parseModelSpec(yaml, "seed"));
    model.build(be, 1);
    const std::vector<uint8_t> bytes = serializeModel(model, nullptr, {});
    const std::string path = std::string(argv[1]) + "/seed-" + std::to_string(n++) + ".onnx";
    std::ofstream out(path, std::ios::binary);
    onnx_io::exportOnnx(parseModelFile(bytes, "seed")).SerializeToOstream(&out);
  }
  for (const char* fixture :
       {"mlp", "cnn", "rescnn", "gpt", "mobile", "bncnn", "dense", "shuffle"}) {
    const std::string from = std::string(TANDEM_SOURCE_DIR) + "/tests/data/onnx-parity/" + fixture;
    std::ifstream in(from + ".onnx", std::ios::binary);
    std::ofstream out(std::string(argv[1]) + "/torch-" + fixture + ".onnx", std::ios::binary);
    if (!(out << in.rdbuf())) {
      std::fprintf(stderr, "cannot copy %s.onnx\n", from.c_str());
      return 1;
    }
  }
  return 0;
}

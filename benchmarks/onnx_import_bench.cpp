// Import speed of a large ONNX model (issue goal: at disk/protobuf speed, >= 200 MB/s).
// Writes an MLP of LAYERS Gemm nodes of WIDTH x WIDTH float32 weights (6 x 2048^2: 100 MB)
// as an ONNX file, then times, each the median of ROUNDS alternated rounds in this one run:
//   read     the file's bytes into memory (the page cache's speed: the limit here),
//   parse    protobuf's ModelProto::ParseFromString of those bytes (the library's limit),
//   import   tandem's importOnnx(path): read, parse, ONNX's checker, the layer list,
//   + file   import and toModelFile (the weights named as the built model names them).
// Prints MB/s of each (file bytes / time) and import's ratio to read and to parse.
//
//   onnx_import_bench [--layers 6] [--width 2048] [--rounds 5] [--dir /tmp]
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/random.h"
#include "onnx/onnx_import.h"

namespace {

using Clock = std::chrono::steady_clock;

// PREFIX followed by the number (appended: GCC 12 at -O3 warns falsely, -Wrestrict, on
// "w" + std::to_string(l)).
std::string numbered(const char* prefix, int l) {
  std::string s(prefix);
  s.append(std::to_string(l));
  return s;
}

onnx::ModelProto mlp(int layers, int64_t width) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("big_mlp");
  const auto shaped = [](onnx::ValueInfoProto* v, const std::string& name, int64_t width) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    t->mutable_shape()->add_dim()->set_dim_param("N");
    t->mutable_shape()->add_dim()->set_dim_value(width);
  };
  shaped(g->add_input(), "x", width);
  tandem::Rng rng(1);
  std::vector<float> values(static_cast<size_t>(width * width));
  std::string prev = "x";
  for (int l = 0; l < layers; ++l) {
    for (float& v : values) v = rng.uniform(-0.02f, 0.02f);
    onnx::TensorProto* w = g->add_initializer();
    w->set_name(numbered("w", l));
    w->set_data_type(onnx::TensorProto::FLOAT);
    w->add_dims(width);
    w->add_dims(width);
    w->set_raw_data(values.data(), values.size() * 4);
    onnx::TensorProto* b = g->add_initializer();
    b->set_name(numbered("b", l));
    b->set_data_type(onnx::TensorProto::FLOAT);
    b->add_dims(width);
    b->set_raw_data(values.data(), static_cast<size_t>(width) * 4);
    onnx::NodeProto* n = g->add_node();
    n->set_op_type("Gemm");
    n->set_name(numbered("fc", l));
    n->add_input(prev);
    n->add_input(w->name());
    n->add_input(b->name());
    prev = numbered("h", l);
    n->add_output(prev);
    auto* tb = n->add_attribute();
    tb->set_name("transB");
    tb->set_type(onnx::AttributeProto::INT);
    tb->set_i(1);
  }
  shaped(g->add_output(), prev, width);
  return m;
}

std::string readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string s(std::filesystem::file_size(path), '\0');
  in.read(s.data(), static_cast<std::streamsize>(s.size()));
  return s;
}

double seconds(const std::function<void()>& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 6, rounds = 5;
  int64_t width = 2048;
  std::string dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--layers")
      layers = std::atoi(v.c_str());
    else if (k == "--width")
      width = std::atoll(v.c_str());
    else if (k == "--rounds")
      rounds = std::atoi(v.c_str());
    else if (k == "--dir")
      dir = v;
    else {
      std::fprintf(stderr, "onnx_import_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (layers < 1 || width < 1 || rounds < 1 || (argc - 1) % 2 != 0) {
    std::fprintf(stderr,
                 "usage: onnx_import_bench [--layers N] [--width W] [--rounds R] [--dir D]\n");
    return 2;
  }
  const std::string path = dir + "/tandem-onnx-import-bench.onnx";
  {
    std::ofstream out(path, std::ios::binary);
    if (!mlp(layers, width).SerializeToOstream(&out)) {
      std::fprintf(stderr, "onnx_import_bench: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  const double mb = static_cast<double>(std::filesystem::file_size(path)) / 1e6;
  std::vector<double> read, parse, import, file;
  size_t sink = 0;
  for (int r = 0; r < rounds; ++r) {
    std::string bytes;
    read.push_back(seconds([&] { bytes = readAll(path); }));
    parse.push_back(seconds([&] {
      onnx::ModelProto m;
      if (!m.ParseFromString(bytes)) std::abort();
      sink += static_cast<size_t>(m.graph().initializer_size());
    }));
    import.push_back(seconds([&] { sink += tandem::onnx_io::importOnnx(path).params.size();
  }));
  file.push_back(seconds([&] {
    sink += tandem::onnx_io::toModelFile(tandem::onnx_io::importOnnx(path)).params.size();
  }));
}
std::filesystem::remove(path);
std::printf("ONNX import of a %.1f MB model (%d Gemm layers of %lld x %lld), median of %d rounds\n",
            mb, layers, static_cast<long long>(width), static_cast<long long>(width), rounds);
const auto row = [&](const char* what, const std::vector<double>& t) {
  std::printf("  %-8s %8.3f s %9.0f MB/s\n", what, median(t), mb / median(t));
};
row("read", read);
row("parse", parse);
row("import", import);
row("+ file", file);
std::printf("import / read %.2fx, import / parse %.2fx; goal >= 200 MB/s: %s (%zu)\n",
            median(read) / median(import), median(parse) / median(import),
            mb / median(import) >= 200 ? "met" : "missed", sink % 2);
return 0;
}

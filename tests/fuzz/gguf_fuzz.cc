// libFuzzer target: GgufFile::FromBytes on arbitrary bytes, then every accessor on every
// key and tensor of whatever parses. Any crash, sanitizer report or out-of-bounds tensor
// range is a bug in the reader's validation.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "model/gguf/ggml_types.h"
#include "model/gguf/gguf_reader.h"

namespace {

// Caps the dequantisation work per input so the fuzzer stays fast on large claimed
// tensors (their bytes exist, the input is just big).
constexpr int64_t kMaxValuesPerInput = 1 << 20;

void Touch(const specnode::GgufFile& f) {
  volatile size_t sink = 0;
  for (const std::string& key : f.keys()) {
    const specnode::GgufValue* v = f.Find(key);
    if (v == nullptr) std::abort();  // every listed key must be findable
    sink = sink + v->str.size() + v->strings.size() + v->ints.size() + v->floats.size();
    for (const std::string& s : v->strings) sink = sink + s.size();
    if (auto i = f.GetInt(key); i.ok()) sink = sink + static_cast<size_t>(*i);
    if (auto d = f.GetFloat(key); d.ok()) sink = sink + (*d == 0.0);
    if (auto b = f.GetBool(key); b.ok()) sink = sink + *b;
    if (auto s = f.GetString(key); s.ok()) sink = sink + s->size();
    if (auto a = f.GetStringArray(key); a.ok()) sink = sink + (*a)->size();
    if (auto a = f.GetIntArray(key); a.ok()) sink = sink + (*a)->size();
    if (auto a = f.GetFloatArray(key); a.ok()) sink = sink + (*a)->size();
  }
  int64_t budget = kMaxValuesPerInput;
  std::vector<float> row;
  for (const specnode::GgufTensorInfo& t : f.tensors()) {
    if (f.FindTensor(t.name) != &t) std::abort();
    if (t.offset + t.n_bytes > f.file_size() || t.offset + t.n_bytes < t.offset) std::abort();
    const int64_t cols = t.dims[0];
    const size_t row_bytes = specnode::GgmlRowBytes(t.type, cols);
    if (row_bytes * static_cast<uint64_t>(t.n_elements() / cols) != t.n_bytes) std::abort();
    const uint8_t* data = f.TensorData(t);
    for (int64_t r = 0; r < t.n_elements() / cols && budget >= cols; ++r, budget -= cols) {
      row.resize(static_cast<size_t>(cols));
      specnode::DequantizeRow(t.type, data + r * row_bytes, row.data(), cols);
      sink = sink + (row[0] == 0.0f) + (row[cols - 1] == 0.0f);
    }
  }
  (void)sink;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file =
      specnode::GgufFile::FromBytes(std::string_view(reinterpret_cast<const char*>(data), size));
  if (file.ok()) Touch(**file);
  return 0;
}

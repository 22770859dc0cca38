#include "model/llama/llama_model.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "model/gguf/ggml_types.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

absl::Status WithPath(const absl::Status& s, const std::string& path) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

// Reads one byte per page of every tensor so the mapping is resident before serving.
void PageIn(const GgufFile& file, const std::function<void(double)>& progress) {
  uint64_t total = 0;
  for (const GgufTensorInfo& t : file.tensors()) total += t.n_bytes;
  uint64_t done = 0, next_report = 0;
  volatile uint8_t sink = 0;
  constexpr uint64_t kPage = 4096;
  for (const GgufTensorInfo& t : file.tensors()) {
    const uint8_t* p = file.TensorData(t);
    for (uint64_t off = 0; off < t.n_bytes; off += kPage) sink = sink + p[off];
    done += t.n_bytes;
    if (progress && (done >= next_report || done == total)) {
      progress(total == 0 ? 1.0 : static_cast<double>(done) / total);
      next_report = done + total / 100;
    }
  }
}

// Tensor-parallel shard: touches only the pages this shard's weight views read (its row
// slices of Q/K/V/gate/up, the rows' column slices of O/down, the replicated embedding and
// head), so a rank does not page in the other ranks' slices. Norms are tiny and skipped.
void PageInShard(const LlamaWeights& w, const std::function<void(double)>& progress) {
  struct Range {
    const uint8_t* p;
    uint64_t row_bytes;  // bytes read per row
    uint64_t stride;     // bytes between rows
    int64_t rows;
  };
  std::vector<Range> ranges;
  const auto add = [&](const WeightView& v) {
    if (v.data == nullptr || v.rows == 0) return;
    ranges.push_back({static_cast<const uint8_t*>(v.data), GgmlRowBytes(v.type, v.cols),
                      v.row_stride, v.rows});
  };
  add(w.token_embd);
  if (w.output.data != w.token_embd.data) add(w.output);
  for (const LayerWeights& l : w.layers) {
    for (const WeightView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      add(*v);
    }
  }
  uint64_t total = 0;
  for (const Range& r : ranges) total += r.row_bytes * r.rows;
  uint64_t done = 0, next_report = 0;
  volatile uint8_t sink = 0;
  constexpr uint64_t kPage = 4096;
  for (const Range& r : ranges) {
    if (r.row_bytes == r.stride) {  // contiguous rows
      for (uint64_t off = 0; off < r.row_bytes * r.rows; off += kPage) sink = sink + r.p[off];
    } else {  // a column slice: each row's first and last byte cover its pages
      for (int64_t row = 0; row < r.rows; ++row) {
        const uint8_t* q = r.p + row * r.stride;
        for (uint64_t off = 0; off < r.row_bytes; off += kPage) sink = sink + q[off];
        sink = sink + q[r.row_bytes - 1];
      }
    }
    done += r.row_bytes * r.rows;
    if (progress && (done >= next_report || done == total)) {
      progress(total == 0 ? 1.0 : static_cast<double>(done) / total);
      next_report = done + total / 100;
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& path,
                                                             const LoadOptions& options) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  auto file = GgufFile::Open(path);
  if (!file.ok()) return WithPath(file.status(), path);
  m->file_ = std::move(file).value();
  auto config = LlamaConfig::FromGguf(*m->file_);
  if (!config.ok()) return WithPath(config.status(), path);
  m->config_ = *config;
  auto weights = LoadLlamaWeights(*m->file_, m->config_, options.shard, options.n_layers);
  if (!weights.ok()) return WithPath(weights.status(), path);
  m->weights_ = std::move(weights).value();
  m->weights_.activations = options.activations;
  auto tokenizer = Tokenizer::FromGguf(*m->file_);
  if (!tokenizer.ok()) return WithPath(tokenizer.status(), path);
  m->tokenizer_ = std::move(tokenizer).value();
  if (!options.chat_template.empty()) m->tokenizer_->ReplaceChatTemplate(options.chat_template);
  if (m->tokenizer_->vocab_size() > m->config_.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": tokenizer has ",
                                                   m->tokenizer_->vocab_size(),
                                                   " tokens but the model's vocabulary is ",
                                                   m->config_.vocab_size));
  }
  if (options.shard.size > 1) {
    PageInShard(m->weights_, options.progress);
  } else {
    PageIn(*m->file_, options.progress);
  }
  return m;
}

}  // namespace specnode

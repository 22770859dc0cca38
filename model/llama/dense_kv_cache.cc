#include "model/llama/dense_kv_cache.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "absl/strings/str_format.h"
#include "model/cpu/cpu_ops.h"
#include "model/status_macros.h"

namespace specnode {

DenseKvCache::DenseKvCache(int n_layers, int n_kv_heads, int head_dim, int gqa_group,
                           int32_t max_seq_len, int64_t max_tokens)
    : CpuKvCache(n_kv_heads, head_dim, gqa_group),
      n_layers_(n_layers),
      n_kv_heads_(n_kv_heads),
      head_dim_(head_dim),
      group_(gqa_group),
      max_seq_len_(max_seq_len),
      max_tokens_(max_tokens) {}

int32_t DenseKvCache::Length(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.length;
}

absl::Status DenseKvCache::Reserve(SeqId seq, int32_t n_new) {
  if (n_new < 0) return absl::InvalidArgumentError("negative reservation");
  auto it = seqs_.find(seq);
  const int32_t length = it == seqs_.end() ? 0 : it->second.length;
  const int64_t need = static_cast<int64_t>(length) + n_new;
  if (need > max_seq_len_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sequence of %d tokens exceeds the context length %d", need, max_seq_len_));
  }
  const int32_t reserved = it == seqs_.end() ? 0 : it->second.reserved;
  if (need <= reserved) return absl::OkStatus();
  int64_t grow_to = std::max<int64_t>(need, std::min<int64_t>(2 * int64_t{reserved}, max_seq_len_));
  if (tokens_reserved_ + (need - reserved) > max_tokens_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "KV cache full: %d of %d token slots in use, %d more needed", tokens_reserved_,
        max_tokens_, need - reserved));
  }
  grow_to = std::min<int64_t>(grow_to, reserved + (max_tokens_ - tokens_reserved_));
  Sequence& s = seqs_[seq];
  const size_t row = static_cast<size_t>(n_kv_heads_) * head_dim_;
  s.k.resize(n_layers_);
  s.v.resize(n_layers_);
  for (int l = 0; l < n_layers_; ++l) {
    s.k[l].resize(grow_to * row);
    s.v[l].resize(grow_to * row);
  }
  tokens_reserved_ += grow_to - s.reserved;
  s.reserved = static_cast<int32_t>(grow_to);
  return absl::OkStatus();
}

void DenseKvCache::WriteSeq(SeqId seq, int layer, int32_t pos0, int32_t n, const float* k,
                            const float* v) {
  Sequence& s = seqs_.at(seq);
  assert(pos0 + n <= s.reserved);
  const size_t row = static_cast<size_t>(n_kv_heads_) * head_dim_;
  std::copy(k, k + n * row, s.k[layer].begin() + pos0 * row);
  std::copy(v, v + n * row, s.v[layer].begin() + pos0 * row);
}

template <typename KeyAt>
void DenseKvCache::AttendHead(const Sequence& s, int layer, int kv_head, const float* qh,
                              float scale, int32_t n_keys, KeyAt key, float* scores,
                              float* oh) const {
  const size_t row = static_cast<size_t>(n_kv_heads_) * head_dim_;
  const float* kbase = s.k[layer].data() + kv_head * head_dim_;
  const float* vbase = s.v[layer].data() + kv_head * head_dim_;
  for (int32_t j = 0; j < n_keys; ++j) {
    const float* kj = kbase + key(j) * row;
    float dot = 0.0f;
    for (int d = 0; d < head_dim_; ++d) dot += qh[d] * kj[d];
    scores[j] = dot * scale;
  }
  SoftmaxInPlace(scores, n_keys);
  std::fill(oh, oh + head_dim_, 0.0f);
  for (int32_t j = 0; j < n_keys; ++j) {
    const float* vj = vbase + key(j) * row;
    const float w = scores[j];
    for (int d = 0; d < head_dim_; ++d) oh[d] += w * vj[d];
  }
}

void DenseKvCache::AttendSeq(SeqId seq, int layer, int32_t pos0, int32_t n, int kv_head,
                             const float* q, float scale, int32_t window, float* out) {
  const Sequence& s = seqs_.at(seq);
  const int n_heads = n_kv_heads_ * group_;
  std::vector<float> scores(pos0 + n);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t n_ctx = pos0 + i + 1;
    const int32_t lo = window > 0 ? std::max(0, n_ctx - window) : 0;  // first position seen
    for (int g = 0; g < group_; ++g) {
      const size_t h = static_cast<size_t>(i) * n_heads + kv_head * group_ + g;
      AttendHead(
          s, layer, kv_head, q + h * head_dim_, scale, n_ctx - lo,
          [lo](int32_t j) { return static_cast<size_t>(lo + j); }, scores.data(),
          out + h * head_dim_);
    }
  }
}

void DenseKvCache::AttendSeqKeys(SeqId seq, int layer, int kv_head, const float* q, float scale,
                                 std::span<const int32_t> keys, float* out) {
  const Sequence& s = seqs_.at(seq);
  std::vector<float> scores(keys.size());
  for (int g = 0; g < group_; ++g) {
    const size_t h = static_cast<size_t>(kv_head) * group_ + g;
    AttendHead(
        s, layer, kv_head, q + h * head_dim_, scale, static_cast<int32_t>(keys.size()),
        [keys](int32_t j) { return static_cast<size_t>(keys[j]); }, scores.data(),
        out + h * head_dim_);
  }
}

void DenseKvCache::Commit(SeqId seq, int32_t new_length) {
  Sequence& s = seqs_.at(seq);
  assert(new_length <= s.reserved);
  s.length = new_length;
}

absl::Status DenseKvCache::Truncate(SeqId seq, int32_t n) {
  auto it = seqs_.find(seq);
  const int32_t length = it == seqs_.end() ? 0 : it->second.length;
  if (n < 0 || n > length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot truncate a %d-token sequence to %d", length, n));
  }
  if (it != seqs_.end()) it->second.length = n;
  return absl::OkStatus();
}

absl::Status DenseKvCache::KeepRows(SeqId seq, int32_t pos0, std::span<const int32_t> rows) {
  SPECNODE_RETURN_IF_ERROR(CheckKeptRows(pos0, Length(seq), rows));
  if (rows.empty()) return Truncate(seq, pos0);
  Sequence& s = seqs_.at(seq);
  const size_t row = static_cast<size_t>(n_kv_heads_) * head_dim_;
  for (int l = 0; l < n_layers_; ++l) {
    // rows[j] >= j, ascending: a source is never a destination already written.
    for (size_t j = 0; j < rows.size(); ++j) {
      if (rows[j] == static_cast<int32_t>(j)) continue;
      const size_t from = (pos0 + rows[j]) * row, to = (pos0 + j) * row;
      std::copy_n(s.k[l].begin() + from, row, s.k[l].begin() + to);
      std::copy_n(s.v[l].begin() + from, row, s.v[l].begin() + to);
    }
  }
  return Truncate(seq, pos0 + static_cast<int32_t>(rows.size()));
}

void DenseKvCache::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  tokens_reserved_ -= it->second.reserved;
  seqs_.erase(it);
}

}  // namespace specnode

// DenseKvCache: the reference KvCache. Each sequence keeps f32 K and V per layer in
// [position][kv_head][head_dim] order, grown by doubling. Capacity is a total number of
// token positions across sequences (max_tokens); Reserve beyond it is ResourceExhausted.
// Thread-safety as in cpu_kv_cache.h.
#pragma once

#include <unordered_map>
#include <vector>

#include "model/llama/cpu_kv_cache.h"

namespace specnode {

class DenseKvCache : public CpuKvCache {
 public:
  // n_kv_heads: kv heads held (this shard's). max_seq_len bounds one sequence (the model's
  // context length); max_tokens bounds the sum over sequences.
  DenseKvCache(int n_layers, int n_kv_heads, int head_dim, int gqa_group, int32_t max_seq_len,
               int64_t max_tokens);

  int32_t Length(SeqId seq) const override;
  absl::Status Reserve(SeqId seq, int32_t n_new) override;
  void WriteSeq(SeqId seq, int layer, int32_t pos0, int32_t n, const float* k,
                const float* v) override;
  void AttendSeq(SeqId seq, int layer, int32_t pos0, int32_t n, int kv_head, const float* q,
                 float scale, int32_t window, float* out) override;
  void AttendSeqKeys(SeqId seq, int layer, int kv_head, const float* q, float scale,
                     std::span<const int32_t> keys, float* out) override;
  void Commit(SeqId seq, int32_t new_length) override;
  absl::Status Truncate(SeqId seq, int32_t n) override;
  absl::Status KeepRows(SeqId seq, int32_t pos0, std::span<const int32_t> rows) override;
  void Free(SeqId seq) override;

  int64_t tokens_reserved() const { return tokens_reserved_; }

 private:
  struct Sequence {
    int32_t length = 0;
    int32_t reserved = 0;  // positions with storage
    std::vector<std::vector<float>> k, v;  // per layer: [reserved, n_kv_heads, head_dim]
  };

  // One query head over keys key(0..n_keys): scores, softmax, weighted values, in key order
  // (AttendSeq and AttendSeqKeys share it, so a tree row's numbers are its path's).
  template <typename KeyAt>
  void AttendHead(const Sequence& s, int layer, int kv_head, const float* qh, float scale,
                  int32_t n_keys, KeyAt key, float* scores, float* oh) const;

  int n_layers_, n_kv_heads_, head_dim_, group_;
  int32_t max_seq_len_;
  int64_t max_tokens_;
  int64_t tokens_reserved_ = 0;
  std::unordered_map<SeqId, Sequence> seqs_;
};

}  // namespace specnode

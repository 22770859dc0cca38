#include "model/llama/kv_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace specnode {

absl::Status KvCache::SwapOut(SeqId seq) {
  return absl::UnimplementedError(
      absl::StrCat("this KV cache (", device().name(), ") has no host tier to swap to"));
}

absl::Status KvCache::SwapIn(SeqId seq) {
  return absl::UnimplementedError(
      absl::StrCat("this KV cache (", device().name(), ") has no host tier to swap from"));
}

absl::Status KvCache::Fork(SeqId src, SeqId dst) {
  return absl::UnimplementedError(
      absl::StrCat("this KV cache (", device().name(), ") cannot share sequences"));
}

void TreeRowPath(std::span<const int32_t> parents, int32_t row, std::vector<int32_t>* path) {
  path->clear();
  for (int32_t r = row; r >= 0; r = parents[r]) path->push_back(r);
  std::reverse(path->begin(), path->end());
}

std::vector<int32_t> TreeRowDepths(std::span<const int32_t> parents) {
  std::vector<int32_t> depth(parents.size());
  for (size_t r = 0; r < parents.size(); ++r) {
    depth[r] = parents[r] < 0 ? 0 : depth[parents[r]] + 1;
  }
  return depth;
}

absl::Status KvCache::KeepRows(SeqId seq, int32_t pos0, std::span<const int32_t> rows) {
  return absl::UnimplementedError(
      absl::StrCat("this KV cache (", device().name(), ") does not take draft-tree passes"));
}

absl::Status CheckKeptRows(int32_t pos0, int32_t length, std::span<const int32_t> rows) {
  const int32_t n = length - pos0;
  if (pos0 < 0 || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("keep rows from %d of a %d-token sequence", pos0, length));
  }
  for (size_t j = 0; j < rows.size(); ++j) {
    const int32_t r = rows[j];
    if (r < static_cast<int32_t>(j) || r >= n || (j > 0 && r <= rows[j - 1])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "keep rows: row %d at %d is not an ascending row of the %d-row pass", r, j, n));
    }
  }
  return absl::OkStatus();
}

absl::Status KvCache::SetEventListener(KvCacheEventListener*) {
  return absl::UnimplementedError(absl::StrCat("this KV cache (", device().name(),
                                               ") has no prefix cache to report events of"));
}

}  // namespace specnode

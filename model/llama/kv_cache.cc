#include "model/llama/kv_cache.h"

#include "absl/strings/str_cat.h"

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

absl::Status KvCache::SetEventListener(KvCacheEventListener*) {
  return absl::UnimplementedError(absl::StrCat("this KV cache (", device().name(),
                                               ") has no prefix cache to report events of"));
}

}  // namespace specnode

#include "kvstore/kv_page_pool.h"

namespace specnode {

absl::Status KvPagePool::ReadSlots(std::span<const KvSlot> slots, uint8_t* host) {
  for (const KvSlot& s : slots) {
    ReadSlot(s, host);
    host += SlotBytes(PageClass(s.page));
  }
  return absl::OkStatus();
}

absl::Status KvPagePool::WriteSlots(std::span<const KvSlot> slots, const uint8_t* host) {
  for (const KvSlot& s : slots) {
    WriteSlot(s, host);
    host += SlotBytes(PageClass(s.page));
  }
  return absl::OkStatus();
}

}  // namespace specnode

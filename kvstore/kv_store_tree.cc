// KvStore: keeping one path of a draft-tree pass (KvCache::KeepRows).
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvstore/kv_store.h"
#include "kvstore/kv_store_internal.h"
#include "model/status_macros.h"

namespace specnode {

absl::Status KvStore::KeepRows(SeqId seq, int32_t pos0, std::span<const int32_t> rows) {
  SPECNODE_RETURN_IF_ERROR(CheckKeptRows(pos0, Length(seq), rows));
  if (!tree_passes()) return KvCache::KeepRows(seq, pos0, rows);
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return Truncate(seq, pos0);  // nothing held: rows is empty
  EndPoolPass();
  SPECNODE_RETURN_IF_ERROR(TakePoolError());
  Sequence& s = *it->second;
  if (s.swapped) return absl::FailedPreconditionError("sequence is swapped out");
  // The kept rows' bytes into the slots of positions pos0 + j, in ascending j: rows[j] >= j,
  // so no source is a destination already written. The pass's rows are the sequence's own
  // fresh slots, all in the class new tokens take (one class: a byte copy is exact).
  std::vector<uint8_t> bytes;
  for (size_t j = 0; j < rows.size(); ++j) {
    if (rows[j] == static_cast<int32_t>(j)) continue;
    const Loc from = s.loc[pos0 + rows[j]];
    const Loc to = s.loc[pos0 + j];
    const KvPrecision p = pages_[from.page]->prec;
    if (pages_[to.page]->prec != p) {
      return absl::InternalError(
          absl::StrCat("kvstore: tree rows of sequence ", seq, " in different classes"));
    }
    bytes.resize(pool_->SlotBytes(p));
    pool_->ReadSlot(from, bytes.data());
    pool_->WriteSlot(to, bytes.data());
  }
  // The kept rows' observations are their path's (staged at pos0 + depth = pos0 + j);
  // the other rows' are dropped.
  std::erase_if(s.staged, [rows](const Sequence::StagedMass& m) {
    return m.row >= 0 && !std::binary_search(rows.begin(), rows.end(), m.row);
  });
  for (Sequence::StagedMass& m : s.staged) m.row = -1;
  return Truncate(seq, pos0 + static_cast<int32_t>(rows.size()));
}

}  // namespace specnode

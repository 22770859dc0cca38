// SPM encoding (tokenizer_spm.h) and the SPM half of Tokenizer's set-up.
//
// The merge loop follows llama.cpp's SPM tokenizer (behaviour, not code): symbols are the
// text's UTF-8 characters in a linked list; every adjacent pair whose concatenation is a
// token is queued with that token's score; the best pair is merged and its new neighbours
// queued, skipping queue entries whose symbols have changed since. A merged symbol is
// always a token, so only single characters can be left without one; those fall back to
// byte tokens.

#include "model/tokenizer/tokenizer_spm.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace specnode {
namespace tokenizer_internal {

namespace {

// Bytes of the UTF-8 sequence a lead byte starts (1 for a stray continuation byte).
uint32_t Utf8Len(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

void SpmEncode(const SpmVocab& vocab, std::string_view text, SpmScratch* s,
               std::vector<int32_t>* out) {
  if (text.empty()) return;
  auto& sym = s->symbols;
  sym.clear();
  for (size_t pos = 0; pos < text.size();) {
    const auto len = static_cast<uint32_t>(
        std::min<size_t>(Utf8Len(static_cast<uint8_t>(text[pos])), text.size() - pos));
    const auto i = static_cast<int32_t>(sym.size());
    sym.push_back({static_cast<uint32_t>(pos), len, i - 1, i + 1});
    pos += len;
  }
  sym.back().next = -1;

  auto find = [&](uint32_t start, uint32_t len) -> int32_t {
    const auto it = vocab.index->find(text.substr(start, len));
    return it == vocab.index->end() ? -1 : it->second;
  };
  auto& heap = s->heap;
  heap.clear();
  auto push_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    // Adjacent symbols are contiguous in the text: the pair is one substring.
    const uint32_t len = sym[left].len + sym[right].len;
    const int32_t id = find(sym[left].start, len);
    if (id < 0 || static_cast<size_t>(id) >= vocab.scores.size()) return;
    heap.push_back({vocab.scores[id], left, right, len});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) push_pair(i - 1, i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const SpmScratch::Bigram b = heap.back();
    heap.pop_back();
    SpmScratch::Symbol& left = sym[b.left];
    SpmScratch::Symbol& right = sym[b.right];
    // Stale: one side was merged away, or grew (then the lengths no longer add up).
    if (left.len == 0 || right.len == 0 || left.len + right.len != b.len) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = b.left;
    push_pair(left.prev, b.left);
    push_pair(b.left, left.next);
  }

  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    if (const int32_t id = find(sym[i].start, sym[i].len); id >= 0) {
      out->push_back(id);
      continue;
    }
    for (uint32_t j = 0; j < sym[i].len; ++j) {
      const int32_t id = vocab.byte_token[static_cast<uint8_t>(text[sym[i].start + j])];
      if (id >= 0) out->push_back(id);
    }
  }
}

void SpmEscape(std::string_view text, bool prefix, std::string* out) {
  out->clear();
  out->reserve(text.size() + 8);
  if (prefix) out->append(kSpmSpace);
  for (char c : text) {
    if (c == ' ') {
      out->append(kSpmSpace);
    } else {
      out->push_back(c);
    }
  }
}

std::string SpmUnescape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (text.substr(pos).starts_with(kSpmSpace)) {
      out.push_back(' ');
      pos += kSpmSpace.size();
    } else {
      out.push_back(text[pos++]);
    }
  }
  return out;
}

int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return -1;
  const int hi = HexDigit(text[3]), lo = HexDigit(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace tokenizer_internal

absl::Status Tokenizer::InitSpm() {
  const size_t n = spec_.tokens.size();
  if (spec_.scores.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", spec_.scores.size(), " scores for ", n, " tokens"));
  }
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(spec_.scores[i])) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: token ", i, " has a NaN score"));
    }
  }
  // A byte falls back to <0xNN>, else to the token that is that byte, else to unk.
  for (int b = 0; b < 256; ++b) {
    int32_t id = FindToken(absl::StrFormat("<0x%02X>", b));
    if (id < 0) id = FindToken(std::string(1, static_cast<char>(b)));
    byte_token_[b] = id >= 0 ? id : spec_.unk_id;
  }
  return absl::OkStatus();
}

}  // namespace specnode

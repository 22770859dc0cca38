// SentencePiece-style (SPM) encoding over a scored vocabulary: the algorithm behind
// Tokenizer for GGUF "tokenizer.ggml.model" = "llama" (tokenizer.h describes the whole
// encode/decode; this is its merge step and helpers). Internal to model/tokenizer/.
//
// SpmEncode is a pure function of its arguments; the vocabulary it reads is borrowed and
// must outlive the call. Concurrent calls are safe with distinct SpmScratch objects.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/tokenizer/tokenizer.h"

namespace specnode::tokenizer_internal {

// U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's visible space.
inline constexpr std::string_view kSpmSpace = "\xe2\x96\x81";

// What SpmEncode reads; borrowed.
struct SpmVocab {
  const TokenIndex* index = nullptr;    // token text -> id
  std::span<const float> scores;        // id -> score (higher merges first)
  const int32_t* byte_token = nullptr;  // [256]: id a byte falls back to, -1 to drop it
};

// Work buffers reused across the spans of one Encode call.
struct SpmScratch {
  struct Symbol {
    uint32_t start;  // byte offset in the text
    uint32_t len;    // 0: merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  struct Bigram {
    float score;
    int32_t left;  // symbol indices
    int32_t right;
    uint32_t len;  // bytes of the pair when it was queued (stale if the symbols changed)
    // Heap order: highest score first, then leftmost.
    bool operator<(const Bigram& o) const {
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::string escaped;
  std::vector<Symbol> symbols;
  std::vector<Bigram> heap;
};

// Appends to *out the ids of `text`: its UTF-8 characters (a truncated sequence at the end
// is one character) merged pairwise by score; pieces left that are not tokens become their
// bytes' fallback tokens. `text` is already escaped (spaces as kSpmSpace) and may be
// empty. Texts of 4 GiB or more are not supported (Encode refuses 2 GiB).
void SpmEncode(const SpmVocab& vocab, std::string_view text, SpmScratch* scratch,
               std::vector<int32_t>* out);

// `text` with every ' ' replaced by kSpmSpace, after one kSpmSpace if `prefix`.
void SpmEscape(std::string_view text, bool prefix, std::string* out);

// Token text -> the same with every kSpmSpace replaced by ' '.
std::string SpmUnescape(std::string_view text);

// "<0xNN>" (two hex digits, either case) -> the byte NN; -1 for any other text.
int ParseByteToken(std::string_view text);

}  // namespace specnode::tokenizer_internal

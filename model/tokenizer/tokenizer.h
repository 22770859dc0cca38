// Byte-level BPE tokenizer (GPT-2 family, as in GGUF "tokenizer.ggml.model" = "gpt2").
//
// Built from GGUF metadata: tokenizer.ggml.tokens / merges / token_type, special ids and
// tokenizer.ggml.pre selecting the pre-tokenizer regex. Immutable after Create(); all
// methods are const and thread-safe.
//
// Encode: (1) if parse_special, split the text on control/user-defined tokens (leftmost
// match, longest at that position, as HF's added vocabulary does) which map straight to
// their ids; (2) pre-tokenize each remaining span with the regex for `pre` (hand-written
// matcher over Unicode categories, no regex engine); (3) map bytes to the GPT-2
// byte-level alphabet; (4) apply merges by rank (lowest rank first, leftmost on ties),
// per word, with a priority queue. Nothing is cached between calls.
// Decode reverses the byte-level mapping; control tokens decode to their text only when
// asked (render_special); user-defined tokens are stored as plain text (as llama.cpp's
// converter writes them) and always decode to it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace specnode {

class GgufFile;

struct TokenizerSpec {
  std::vector<std::string> tokens;   // id -> token text (byte-level alphabet)
  std::vector<std::string> merges;   // "left right", by rank
  std::vector<int32_t> token_types;  // 1 normal, 2 unknown, 3 control, 4 user-defined,
                                     // 5 unused, 6 byte; empty = all normal
  std::string pre = "gpt2";          // "gpt2", "smollm", "llama-bpe"/"llama3", "qwen2", ...
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;
  std::string chat_template;  // tokenizer.chat_template (Jinja text), may be empty
};

namespace tokenizer_internal {

// The pre-tokenizer regexes, each reproduced by a hand-written matcher that is exactly
// equivalent to the regex (leftmost match, backtracking included, e.g. "\s+(?!\S)"
// leaves the last whitespace character of a run to prefix the next word):
//   kGpt2   "gpt2", "gpt-2":  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+
//                             |\s+(?!\S)|\s+
//   kSmolLm "smollm":         every \p{N} is split off alone first, then kGpt2 runs on
//                             the spans between them (HF: Digits(individual_digits) then
//                             ByteLevel(use_regex)).
//   kLlama3 "llama-bpe", "llama3": (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+
//                             |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2  "qwen2":          as kLlama3 but \p{N} (one digit) and ASCII-only case folding
//                             ('[sS]|'[tT]|...).
// \p{L}, \p{N}, \s are the classes of model/unicode_data.h.
enum class PreTokenizer { kGpt2, kSmolLm, kLlama3, kQwen2 };

// InvalidArgument naming `name` when it is not one of the names above.
absl::StatusOr<PreTokenizer> ParsePreTokenizer(std::string_view name);

// Appends the pre-tokens of `text` to *out, in order; they are non-empty and concatenate
// to `text`. `text` should be valid UTF-8; invalid bytes are tolerated (each is taken as
// one character of no class) so that no input can make this read out of bounds.
void PreTokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>* out);

}  // namespace tokenizer_internal

class Tokenizer {
 public:
  // Validates the spec (InvalidArgument): non-empty vocabulary, token_types empty or one
  // per token with values 0..6, special ids -1 or in range, add_bos only with a bos id,
  // every merge "left right" with left, right and left+right in the vocabulary, `pre`
  // known (the message names it). A byte whose byte-level character is not a token (real
  // vocabularies lack a few control bytes, e.g. SmolLM2 has no token for 0x04) is
  // dropped from the input before merging, as HF's BPE without unk and llama.cpp do.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerSpec spec);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);

  // Text must be valid UTF-8 (InvalidArgument otherwise). Adds BOS when spec.add_bos.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool parse_special) const;
  // Raw bytes of the token's text (may be a partial UTF-8 sequence). Control, unknown and
  // unused tokens give their text when render_special, else ""; user-defined tokens always
  // give their text. Out-of-range ids give "".
  std::string TokenToBytes(int32_t id, bool render_special = false) const;
  std::string Decode(std::span<const int32_t> ids, bool render_special = false) const;

  int32_t vocab_size() const { return static_cast<int32_t>(spec_.tokens.size()); }
  int32_t bos_id() const { return spec_.bos_id; }
  int32_t eos_id() const { return spec_.eos_id; }
  // End-of-generation: eos, and control tokens such as <|im_end|>, <|endoftext|>, <|eot_id|>.
  bool IsEndOfGeneration(int32_t id) const;
  // Every id IsEndOfGeneration accepts, ascending.
  std::vector<int32_t> EndOfGenerationIds() const;
  // Id of an exact token text, -1 if absent.
  int32_t FindToken(std::string_view text) const;
  const TokenizerSpec& spec() const { return spec_; }
  // Replaces spec().chat_template (a built-in one named by the user, chat_template.h); not
  // thread-safe: before the tokenizer is shared.
  void ReplaceChatTemplate(std::string jinja) { spec_.chat_template = std::move(jinja); }

 private:
  struct Scratch;  // per-Encode work buffers (tokenizer.cc)

  explicit Tokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {}
  absl::Status Init();
  void EncodeWord(std::string_view word, Scratch* scratch, std::vector<int32_t>* out) const;
  void EncodeSpan(std::string_view span, Scratch* scratch, std::vector<int32_t>* out) const;

  TokenizerSpec spec_;
  tokenizer_internal::PreTokenizer pre_kind_ = tokenizer_internal::PreTokenizer::kGpt2;
  bool ignore_merges_ = false;  // Llama-3: a word that is itself a token skips the merges
  std::unordered_map<std::string, int32_t> token_to_id_;  // first id wins on duplicates
  // (left id << 32 | right id) -> {rank, merged id}; first (lowest) rank wins.
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  int32_t byte_token_[256] = {};               // token id of each byte's character, or -1
  std::string byte_char_[256];                 // that character, UTF-8 encoded
  std::vector<std::string> decoded_;           // id -> raw bytes (control tokens: their text)
  std::vector<int32_t> special_ids_;           // control + user-defined, longest first
  std::vector<int32_t> special_by_byte_[256];  // the same, indexed by first byte
  std::vector<bool> is_eog_;
};

// Turns a stream of token byte pieces into complete UTF-8 text: holds back a trailing
// incomplete sequence until its continuation bytes arrive. Not thread-safe.
class Utf8StreamDecoder {
 public:
  // Returns the text that is complete so far (may be empty); always valid UTF-8: bytes
  // that can never become valid are replaced by U+FFFD, one per maximal subpart.
  std::string Push(std::string_view bytes);
  // Returns anything held back (a cut-off sequence becomes one U+FFFD) and resets.
  std::string Flush();

 private:
  std::string pending_;
};

}  // namespace specnode

// Byte-level BPE tokenizer (GPT-2 family, as in GGUF "tokenizer.ggml.model" = "gpt2").
//
// Built from GGUF metadata: tokenizer.ggml.tokens / merges / token_type, special ids and
// tokenizer.ggml.pre selecting the pre-tokenizer regex. Immutable after Create(); all
// methods are const and thread-safe.
//
// Encode: (1) if parse_special, split the text on control/user-defined tokens (longest
// match first) which map straight to their ids; (2) pre-tokenize each remaining span with
// the regex for `pre` (hand-written matcher over Unicode categories, no regex engine);
// (3) map bytes to the GPT-2 byte-level alphabet; (4) apply merges by rank.
// Decode reverses the byte-level mapping; control tokens decode to their text only when
// asked (render_special).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"

namespace specnode {

class GgufFile;

struct TokenizerSpec {
  std::vector<std::string> tokens;    // id -> token text (byte-level alphabet)
  std::vector<std::string> merges;    // "left right", by rank
  std::vector<int32_t> token_types;   // 1 normal, 2 unknown, 3 control, 4 user-defined,
                                      // 5 unused, 6 byte; empty = all normal
  std::string pre = "gpt2";           // "gpt2", "smollm", "llama-bpe"/"llama3", "qwen2", ...
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;
  std::string chat_template;          // tokenizer.chat_template (Jinja text), may be empty
};

class Tokenizer {
 public:
  // Validates the spec (ids in range, merges refer to known tokens, every byte of the
  // byte-level alphabet is a token, unknown `pre` -> InvalidArgument naming it).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerSpec spec);
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);

  // Text must be valid UTF-8 (InvalidArgument otherwise). Adds BOS when spec.add_bos.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool parse_special) const;
  // Raw bytes of the token's text (may be a partial UTF-8 sequence). Control tokens give
  // their text when render_special, else "". Out-of-range ids give "".
  std::string TokenToBytes(int32_t id, bool render_special = false) const;
  std::string Decode(std::span<const int32_t> ids, bool render_special = false) const;

  int32_t vocab_size() const { return static_cast<int32_t>(spec_.tokens.size()); }
  int32_t bos_id() const { return spec_.bos_id; }
  int32_t eos_id() const { return spec_.eos_id; }
  // End-of-generation: eos, and control tokens such as <|im_end|>, <|endoftext|>, <|eot_id|>.
  bool IsEndOfGeneration(int32_t id) const;
  // Id of an exact token text, -1 if absent.
  int32_t FindToken(std::string_view text) const;
  const TokenizerSpec& spec() const { return spec_; }

 private:
  explicit Tokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {}
  absl::Status Init();
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

  TokenizerSpec spec_;
  int pre_kind_ = 0;
  std::unordered_map<std::string, int32_t> token_to_id_;
  std::unordered_map<std::string, int32_t> merge_rank_;  // "left right" -> rank
  std::vector<int32_t> special_ids_;                      // control + user-defined, longest first
  std::vector<bool> is_eog_;
};

// Turns a stream of token byte pieces into complete UTF-8 text: holds back a trailing
// incomplete sequence until its continuation bytes arrive. Not thread-safe.
class Utf8StreamDecoder {
 public:
  // Returns the text that is complete so far (may be empty).
  std::string Push(std::string_view bytes);
  // Returns anything held back (invalid bytes become U+FFFD).
  std::string Flush();

 private:
  std::string pending_;
};

}  // namespace specnode

// Tokenizers built from GGUF metadata, for the two vocabulary kinds of
// "tokenizer.ggml.model":
//   "gpt2"   byte-level BPE (GPT-2 family: SmolLM2, Llama 3, Qwen2), tokenizer.cc;
//   "llama"  SentencePiece-style (SPM) vocabularies with scores (Llama 2, Mistral, Gemma),
//            as llama.cpp's SPM tokenizer encodes them; tokenizer_spm.cc.
// Immutable after Create(); all methods are const and thread-safe.
//
// BPE: built from tokenizer.ggml.tokens / merges / token_type, special ids and
// tokenizer.ggml.pre selecting the pre-tokenizer regex.
// Encode: (1) if parse_special, split the text on control/user-defined tokens (leftmost
// match, longest at that position, as HF's added vocabulary does) which map straight to
// their ids; (2) pre-tokenize each remaining span with the regex for `pre` (hand-written
// matcher over Unicode categories, no regex engine); (3) map bytes to the GPT-2
// byte-level alphabet; (4) apply merges by rank (lowest rank first, leftmost on ties),
// per word, with a priority queue. Nothing is cached between calls.
// Decode reverses the byte-level mapping; control tokens decode to their text only when
// asked (render_special); user-defined tokens are stored as plain text (as llama.cpp's
// converter writes them) and always decode to it.
//
// SPM: built from tokenizer.ggml.tokens / scores / token_type, special ids,
// add_bos_token / add_eos_token / add_space_prefix (llama.cpp's defaults when absent:
// bos 1, eos 2, unk 0, add_bos on, add_eos off, add_space_prefix on).
// Encode: (1) split on special tokens with the same matcher as BPE, where user-defined
// tokens are always matched (as llama.cpp does; Gemma's runs of spaces, tabs and newlines
// are user-defined tokens) and control and unknown tokens only if parse_special; (2) each
// remaining span gets a leading space if add_space_prefix and it is the first span or
// follows a special token, then every ' ' becomes U+2581 ("▁"); (3) the span's UTF-8
// characters are merged pairwise, highest score of an adjacent pair whose concatenation is
// a token first (leftmost on ties); (4) a final piece that is not a token (only single
// characters can be) becomes its bytes' <0xNN> tokens. add_bos / add_eos wrap the ids.
// Decode: U+2581 becomes ' ', byte tokens their byte; with add_space_prefix the first
// piece of a Decode() loses one leading space (llama.cpp's detokenize, which keeps the
// space when the first id is BOS). Two deliberate differences from llama.cpp: token types
// are the file's (llama.cpp re-types any token spelled "</s>" as a control end of
// generation, wrong for Gemma, where it is the HTML tag beside <s>), and special tokens
// match leftmost-longest where llama.cpp takes the longest token first over the whole
// text (the same split unless two special tokens can overlap; Gemma's cannot).
#pragma once

#include <cstdint>
#include <functional>
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

// GGUF tokenizer.ggml.model: "gpt2" is kBpe, "llama" is kSpm.
enum class TokenizerModel { kBpe, kSpm };

struct TokenizerSpec {
  TokenizerModel model = TokenizerModel::kBpe;
  std::vector<std::string> tokens;   // id -> token text (BPE: byte-level alphabet;
                                     // SPM: spaces as U+2581, bytes as <0xNN>)
  std::vector<std::string> merges;   // BPE: "left right", by rank; SPM: unused
  std::vector<float> scores;         // SPM: one per token, higher merges first; BPE: unused
  std::vector<int32_t> token_types;  // 1 normal, 2 unknown, 3 control, 4 user-defined,
                                     // 5 unused, 6 byte; empty = all normal
  std::string pre = "gpt2";          // BPE: "gpt2", "smollm", "llama-bpe"/"llama3", "qwen2",
                                     // ...; SPM: not used (files say "default")
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;
  bool add_eos = false;           // SPM only (BPE never appends EOS)
  bool add_space_prefix = false;  // SPM only: see above
  std::string chat_template;      // tokenizer.chat_template (Jinja text), may be empty
};

namespace tokenizer_internal {

// Token text -> id with lookups by string_view (no allocation).
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIndex = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

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
  // SPM: one score per token, none NaN, add_eos only with an eos id; merges and `pre` are
  // ignored. A byte without a <0xNN> token falls back to the token that is that one byte,
  // else to unk, else is dropped (llama.cpp would throw).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerSpec spec);
  // tokenizer.ggml.model "gpt2" or "llama" (Unimplemented otherwise); InvalidArgument
  // naming the key when a required one (tokens, merges for BPE, scores for SPM) is missing
  // or has the wrong type.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);

  // Text must be valid UTF-8 (InvalidArgument otherwise). Adds BOS when spec.add_bos (and,
  // SPM only, EOS when spec.add_eos).
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool parse_special) const;
  // Raw bytes of the token's text (may be a partial UTF-8 sequence). Control, unknown and
  // unused tokens give their text when render_special, else ""; user-defined tokens always
  // give their text. Out-of-range ids give "".
  std::string TokenToBytes(int32_t id, bool render_special = false) const;
  // The pieces' bytes, concatenated; SPM with add_space_prefix drops one leading space of
  // the first piece.
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
  absl::Status InitBpe();  // byte tables and merges
  absl::Status InitSpm();  // scores and byte fallbacks (tokenizer_spm.cc)
  void InitPieces();       // decoded_, special tokens, end of generation
  void EncodeWord(std::string_view word, Scratch* scratch, std::vector<int32_t>* out) const;
  void EncodeSpan(std::string_view span, Scratch* scratch, std::vector<int32_t>* out) const;
  void EncodeSpmSpan(std::string_view span, Scratch* scratch, std::vector<int32_t>* out) const;
  int32_t TokenType(int32_t id) const;

  TokenizerSpec spec_;
  bool spm_ = false;  // spec_.model == kSpm
  tokenizer_internal::PreTokenizer pre_kind_ = tokenizer_internal::PreTokenizer::kGpt2;
  bool ignore_merges_ = false;  // Llama-3: a word that is itself a token skips the merges
  tokenizer_internal::TokenIndex token_to_id_;  // first id wins on duplicates
  // (left id << 32 | right id) -> {rank, merged id}; first (lowest) rank wins.
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  int32_t byte_token_[256] = {};      // BPE: token id of each byte's character, or -1;
                                      // SPM: of the byte's fallback token (<0xNN>), or -1
  std::string byte_char_[256];        // that character, UTF-8 encoded
  std::vector<std::string> decoded_;  // id -> raw bytes (control tokens: their text)
  std::vector<int32_t> special_ids_;  // control + user-defined (SPM: + unknown), longest first
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

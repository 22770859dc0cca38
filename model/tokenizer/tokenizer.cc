#include "model/tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <climits>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/gguf/gguf_reader.h"
#include "model/status_macros.h"
#include "model/tokenizer/tokenizer_spm.h"
#include "model/tokenizer/unicode_data.h"

namespace specnode {

using tokenizer_internal::PreTokenizer;

namespace {

constexpr int32_t kTypeNormal = 1;
constexpr int32_t kTypeUnknown = 2;
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;
constexpr int32_t kTypeByte = 6;

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68
// bytes to U+0100 onwards in byte order.
std::array<char32_t, 256> ByteToChar() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    map[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

// Inverse of ByteToChar (-1 for characters outside the alphabet).
int CharToByte(char32_t cp) {
  static const std::array<int, 324> table = [] {
    std::array<int, 324> t{};
    t.fill(-1);
    const std::array<char32_t, 256> map = ByteToChar();
    for (int b = 0; b < 256; ++b) t[map[b]] = b;
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

// Byte-level token text -> raw bytes. Characters outside the alphabet (some vocabularies
// have them) are kept as their UTF-8; invalid UTF-8 is copied through.
std::string ByteLevelDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp = 0;
    const int n = unicode::DecodeUtf8(text, pos, &cp);
    if (n == 0) {
      out.push_back(text[pos++]);
      continue;
    }
    const int b = CharToByte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(text.substr(pos, static_cast<size_t>(n)));
    }
    pos += static_cast<size_t>(n);
  }
  return out;
}

bool IsEogText(std::string_view text) {
  return text == "<|im_end|>" || text == "<|endoftext|>" || text == "<|eot_id|>" ||
         text == "<|end_of_text|>" || text == "</s>" || text == "<end_of_turn>";
}

absl::Status CheckId(const char* what, int32_t id, size_t n_tokens) {
  if (id < -1 || (id >= 0 && static_cast<size_t>(id) >= n_tokens)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", what, " id ", id, " is out of range [0, ", n_tokens, ")"));
  }
  return absl::OkStatus();
}

// Optional GGUF integer id: `absent` when absent.
absl::StatusOr<int32_t> OptionalId(const GgufFile& file, std::string_view key, int32_t absent) {
  if (file.Find(key) == nullptr) return absent;
  SPECNODE_ASSIGN_OR_RETURN(int64_t v, file.GetInt(key));
  if (v < -1 || v > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF ", std::string(key), " = ", v, " is out of range"));
  }
  return static_cast<int32_t>(v);
}

// A string array the tokenizer cannot do without: InvalidArgument naming the key if absent.
absl::StatusOr<const std::vector<std::string>*> RequiredStrings(const GgufFile& file,
                                                                std::string_view key) {
  if (file.Find(key) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF ", std::string(key), " is missing"));
  }
  return file.GetStringArray(key);
}

}  // namespace

// Work buffers for one Encode call (so concurrent calls share nothing).
struct Tokenizer::Scratch {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;  // index of the left symbol
    int32_t left_id;
    int32_t right_id;
    int32_t merged_id;
    // Priority order: lowest rank first, then leftmost (as HF's BPE).
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<std::string_view> words;
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::string mapped;
  tokenizer_internal::SpmScratch spm;
  bool after_special = true;  // SPM: the next span starts the text or follows a special token
};

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerSpec spec) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer(std::move(spec)));
  SPECNODE_RETURN_IF_ERROR(tok->Init());
  return tok;
}

absl::Status Tokenizer::Init() {
  spm_ = spec_.model == TokenizerModel::kSpm;
  if (!spm_) {
    SPECNODE_ASSIGN_OR_RETURN(pre_kind_, tokenizer_internal::ParsePreTokenizer(spec_.pre));
    ignore_merges_ = pre_kind_ == PreTokenizer::kLlama3;
  }
  const size_t n = spec_.tokens.size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer: empty vocabulary");
  if (n > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("tokenizer: vocabulary too large");
  }
  if (!spec_.token_types.empty() && spec_.token_types.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", spec_.token_types.size(), " token types for ", n, " tokens"));
  }
  for (size_t i = 0; i < spec_.token_types.size(); ++i) {
    // 0 is GGUF's "undefined"; treated as normal.
    if (spec_.token_types[i] < 0 || spec_.token_types[i] > 6) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: token ", i, " has unknown type ", spec_.token_types[i]));
    }
  }
  SPECNODE_RETURN_IF_ERROR(CheckId("bos", spec_.bos_id, n));
  SPECNODE_RETURN_IF_ERROR(CheckId("eos", spec_.eos_id, n));
  SPECNODE_RETURN_IF_ERROR(CheckId("unk", spec_.unk_id, n));
  SPECNODE_RETURN_IF_ERROR(CheckId("pad", spec_.pad_id, n));
  if (spec_.add_bos && spec_.bos_id < 0) {
    return absl::InvalidArgumentError("tokenizer: add_bos is set but there is no bos id");
  }
  if (spm_ && spec_.add_eos && spec_.eos_id < 0) {
    return absl::InvalidArgumentError("tokenizer: add_eos is set but there is no eos id");
  }

  token_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) token_to_id_.emplace(spec_.tokens[i], static_cast<int32_t>(i));

  if (spm_) {
    SPECNODE_RETURN_IF_ERROR(InitSpm());
  } else {
    SPECNODE_RETURN_IF_ERROR(InitBpe());
  }
  InitPieces();
  return absl::OkStatus();
}

absl::Status Tokenizer::InitBpe() {
  const std::array<char32_t, 256> byte_to_char = ByteToChar();
  for (int b = 0; b < 256; ++b) {
    unicode::AppendUtf8(byte_to_char[b], &byte_char_[b]);
    const int32_t id = FindToken(byte_char_[b]);
    byte_token_[b] = id;
  }

  merges_.reserve(spec_.merges.size());
  for (size_t r = 0; r < spec_.merges.size(); ++r) {
    const std::string& m = spec_.merges[r];
    const size_t space = m.size() < 2 ? std::string::npos : m.find(' ', 1);
    if (space == std::string::npos || space + 1 >= m.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: merge ", r, " \"", m, "\" is not \"left right\""));
    }
    const std::string_view left = std::string_view(m).substr(0, space);
    const std::string_view right = std::string_view(m).substr(space + 1);
    const int32_t l = FindToken(left), rt = FindToken(right);
    const int32_t merged = FindToken(std::string(left).append(right));
    if (l < 0 || rt < 0 || merged < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: merge ", r, " \"", m,
                                                     "\" refers to a token not in the vocabulary"));
    }
    const uint64_t key = (static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(rt);
    merges_.emplace(key, std::make_pair(static_cast<int32_t>(r), merged));
  }
  return absl::OkStatus();
}

void Tokenizer::InitPieces() {
  const size_t n = spec_.tokens.size();
  decoded_.resize(n);
  is_eog_.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    const int32_t type = spec_.token_types.empty() ? kTypeNormal : spec_.token_types[i];
    const std::string& text = spec_.tokens[i];
    const int byte = spm_ && type == kTypeByte ? tokenizer_internal::ParseByteToken(text) : -1;
    if (byte >= 0) {
      decoded_[i] = std::string(1, static_cast<char>(byte));  // SPM <0xNN>
    } else if (type == kTypeNormal || type == kTypeByte || type == 0) {
      decoded_[i] = spm_ ? tokenizer_internal::SpmUnescape(text) : ByteLevelDecode(text);
    } else {
      decoded_[i] = text;  // control/unknown/unused (rendered on request), user-defined
    }
    const bool special = type == kTypeControl || type == kTypeUserDefined ||
                         (spm_ && type == kTypeUnknown);  // llama.cpp matches <unk> too
    if (special && !text.empty() && unicode::FindInvalidUtf8(text) == std::string_view::npos) {
      // Valid UTF-8 only, so a match never splits a character of (valid) input text.
      special_ids_.push_back(static_cast<int32_t>(i));
    }
    if (type == kTypeControl && IsEogText(text)) is_eog_[i] = true;
  }
  if (spec_.eos_id >= 0) is_eog_[spec_.eos_id] = true;
  std::stable_sort(special_ids_.begin(), special_ids_.end(), [&](int32_t a, int32_t b) {
    return spec_.tokens[a].size() > spec_.tokens[b].size();
  });
  for (int32_t id : special_ids_) {
    special_by_byte_[static_cast<uint8_t>(spec_.tokens[id][0])].push_back(id);
  }
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  SPECNODE_ASSIGN_OR_RETURN(std::string model, file.GetString("tokenizer.ggml.model"));
  TokenizerSpec spec;
  if (model == "llama") {
    spec.model = TokenizerModel::kSpm;
  } else if (model != "gpt2") {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer model '", model,
                     "' is not supported (byte-level BPE 'gpt2' and SentencePiece 'llama' are)"));
  }
  const bool spm = spec.model == TokenizerModel::kSpm;
  SPECNODE_ASSIGN_OR_RETURN(const std::vector<std::string>* tokens,
                            RequiredStrings(file, "tokenizer.ggml.tokens"));
  spec.tokens = *tokens;
  if (spm) {
    if (file.Find("tokenizer.ggml.scores") == nullptr) {
      return absl::InvalidArgumentError(
          "GGUF tokenizer.ggml.scores is missing (a SentencePiece 'llama' vocabulary needs "
          "one score per token)");
    }
    SPECNODE_ASSIGN_OR_RETURN(const std::vector<double>* scores,
                              file.GetFloatArray("tokenizer.ggml.scores"));
    spec.scores.assign(scores->begin(), scores->end());
    // llama.cpp's SPM defaults, for files that do not say.
    spec.bos_id = 1;
    spec.eos_id = 2;
    spec.unk_id = 0;
    spec.add_bos = true;
    spec.add_space_prefix = true;
  } else {
    SPECNODE_ASSIGN_OR_RETURN(const std::vector<std::string>* merges,
                              RequiredStrings(file, "tokenizer.ggml.merges"));
    spec.merges = *merges;
  }
  if (file.Find("tokenizer.ggml.token_type") != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(const std::vector<int64_t>* types,
                              file.GetIntArray("tokenizer.ggml.token_type"));
    spec.token_types.reserve(types->size());
    for (int64_t t : *types) {
      // Out-of-range values are clamped to an invalid type that Init() reports.
      spec.token_types.push_back(t < 0 || t > 6 ? -1 : static_cast<int32_t>(t));
    }
  }
  if (file.Find("tokenizer.ggml.pre") != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(spec.pre, file.GetString("tokenizer.ggml.pre"));
  }
  SPECNODE_ASSIGN_OR_RETURN(spec.bos_id,
                            OptionalId(file, "tokenizer.ggml.bos_token_id", spec.bos_id));
  SPECNODE_ASSIGN_OR_RETURN(spec.eos_id,
                            OptionalId(file, "tokenizer.ggml.eos_token_id", spec.eos_id));
  SPECNODE_ASSIGN_OR_RETURN(spec.unk_id,
                            OptionalId(file, "tokenizer.ggml.unknown_token_id", spec.unk_id));
  SPECNODE_ASSIGN_OR_RETURN(spec.pad_id, OptionalId(file, "tokenizer.ggml.padding_token_id", -1));
  if (spm) {
    // A default id outside a (small) vocabulary means none, as llama.cpp's checks do.
    const auto n = static_cast<int64_t>(spec.tokens.size());
    for (int32_t* id : {&spec.bos_id, &spec.eos_id, &spec.unk_id}) {
      if (*id >= n) *id = -1;
    }
    if (spec.bos_id < 0) spec.add_bos = false;
  }
  if (file.Find("tokenizer.ggml.add_bos_token") != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(spec.add_bos, file.GetBool("tokenizer.ggml.add_bos_token"));
  }
  if (spm && file.Find("tokenizer.ggml.add_eos_token") != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(spec.add_eos, file.GetBool("tokenizer.ggml.add_eos_token"));
  }
  if (spm && file.Find("tokenizer.ggml.add_space_prefix") != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(spec.add_space_prefix,
                              file.GetBool("tokenizer.ggml.add_space_prefix"));
  }
  if (file.Find("tokenizer.chat_template") != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(spec.chat_template, file.GetString("tokenizer.chat_template"));
  }
  return Create(std::move(spec));
}

void Tokenizer::EncodeWord(std::string_view word, Scratch* s, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    if (const int32_t id = byte_token_[static_cast<uint8_t>(word[0])]; id >= 0) out->push_back(id);
    return;
  }
  if (ignore_merges_) {
    s->mapped.clear();
    for (char ch : word) s->mapped += byte_char_[static_cast<uint8_t>(ch)];
    if (const int32_t id = FindToken(s->mapped); id >= 0) {
      out->push_back(id);
      return;
    }
  }
  auto& sym = s->symbols;
  sym.clear();
  for (char ch : word) {
    const int32_t id = byte_token_[static_cast<uint8_t>(ch)];
    if (id < 0) continue;  // no token for this byte: dropped, so its neighbours may merge
    const auto i = static_cast<int32_t>(sym.size());
    sym.push_back({id, i - 1, i + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;
  const auto len = static_cast<int32_t>(sym.size());
  auto& heap = s->heap;
  heap.clear();
  auto push_pair = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = sym[left].next;
    if (right < 0) return;
    const uint64_t key =
        (static_cast<uint64_t>(sym[left].id) << 32) | static_cast<uint32_t>(sym[right].id);
    const auto it = merges_.find(key);
    if (it == merges_.end()) return;
    heap.push_back({it->second.first, left, sym[left].id, sym[right].id, it->second.second});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 0; i + 1 < len; ++i) push_pair(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Scratch::Candidate c = heap.back();
    heap.pop_back();
    // Stale entries: either side has since merged (ids only change by merging, and a
    // removed symbol has id -1), so equal ids mean the pair is still there.
    const int32_t right = sym[c.pos].next;
    if (sym[c.pos].id != c.left_id || right < 0 || sym[right].id != c.right_id) continue;
    sym[c.pos].id = c.merged_id;
    sym[right].id = -1;
    sym[c.pos].next = sym[right].next;
    if (sym[right].next >= 0) sym[sym[right].next].prev = c.pos;
    push_pair(sym[c.pos].prev);
    push_pair(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
}

void Tokenizer::EncodeSpan(std::string_view span, Scratch* s, std::vector<int32_t>* out) const {
  if (spm_) {
    EncodeSpmSpan(span, s, out);
    return;
  }
  s->words.clear();
  tokenizer_internal::PreTokenize(pre_kind_, span, &s->words);
  for (std::string_view w : s->words) EncodeWord(w, s, out);
}

void Tokenizer::EncodeSpmSpan(std::string_view span, Scratch* s, std::vector<int32_t>* out) const {
  if (span.empty()) return;  // no fragment: the next span still follows the special token
  tokenizer_internal::SpmEscape(span, spec_.add_space_prefix && s->after_special, &s->spm.escaped);
  s->after_special = false;
  const tokenizer_internal::SpmVocab vocab{&token_to_id_, spec_.scores, byte_token_};
  tokenizer_internal::SpmEncode(vocab, s->spm.escaped, &s->spm, out);
}

int32_t Tokenizer::TokenType(int32_t id) const {
  return spec_.token_types.empty() ? kTypeNormal : spec_.token_types[id];
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       bool parse_special) const {
  if (const size_t bad = unicode::FindInvalidUtf8(text); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 (at byte offset ", bad, ")"));
  }
  if (text.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("text is too long to tokenize (2 GiB or more)");
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (spec_.add_bos) out.push_back(spec_.bos_id);
  Scratch scratch;
  // SPM matches user-defined tokens even without parse_special (llama.cpp does).
  if ((!parse_special && !spm_) || special_ids_.empty()) {
    EncodeSpan(text, &scratch, &out);
    if (spm_ && spec_.add_eos) out.push_back(spec_.eos_id);
    return out;
  }
  size_t span_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    int32_t found = -1;
    for (int32_t id : special_by_byte_[static_cast<uint8_t>(text[pos])]) {
      if (!parse_special && TokenType(id) != kTypeUserDefined) continue;
      if (text.substr(pos).starts_with(spec_.tokens[id])) {
        found = id;  // candidates are longest first
        break;
      }
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    EncodeSpan(text.substr(span_start, pos - span_start), &scratch, &out);
    out.push_back(found);
    scratch.after_special = true;
    pos += spec_.tokens[found].size();
    span_start = pos;
  }
  EncodeSpan(text.substr(span_start), &scratch, &out);
  if (spm_ && spec_.add_eos) out.push_back(spec_.eos_id);
  return out;
}

std::string Tokenizer::TokenToBytes(int32_t id, bool render_special) const {
  if (id < 0 || id >= vocab_size()) return "";
  const int32_t type = TokenType(id);
  const bool plain =
      type == kTypeNormal || type == kTypeByte || type == kTypeUserDefined || type == 0;
  return plain || render_special ? decoded_[id] : std::string();
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  for (int32_t id : ids) out += TokenToBytes(id, render_special);
  // llama.cpp strips the first piece's leading space, whatever the piece (a BOS renders as
  // "" or "<bos>", so the next piece keeps its space).
  if (spm_ && spec_.add_space_prefix && !ids.empty() &&
      TokenToBytes(ids[0], render_special).starts_with(' ')) {
    out.erase(0, 1);
  }
  return out;
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return id >= 0 && id < vocab_size() && is_eog_[id];
}

std::vector<int32_t> Tokenizer::EndOfGenerationIds() const {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < vocab_size(); ++i) {
    if (is_eog_[i]) ids.push_back(i);
  }
  return ids;
}

int32_t Tokenizer::FindToken(std::string_view text) const {
  const auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

std::string Utf8StreamDecoder::Push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    char32_t cp = 0;
    int prefix = 0;
    const int n = unicode::Utf8Sequence(pending_, pos, &cp, &prefix);
    if (n > 0) {
      out.append(pending_, pos, static_cast<size_t>(n));
      pos += static_cast<size_t>(n);
      continue;
    }
    const auto lead = static_cast<uint8_t>(pending_[pos]);
    if (pos + static_cast<size_t>(prefix) == pending_.size() && lead >= 0xC2 && lead <= 0xF4) {
      break;  // a valid start cut off by the end: wait for the rest
    }
    unicode::AppendUtf8(0xFFFD, &out);
    pos += static_cast<size_t>(prefix);
  }
  pending_.erase(0, pos);
  return out;
}

std::string Utf8StreamDecoder::Flush() {
  std::string out;
  if (!pending_.empty()) unicode::AppendUtf8(0xFFFD, &out);  // only a cut-off start remains
  pending_.clear();
  return out;
}

}  // namespace specnode

// libFuzzer target for the tokenizer: arbitrary bytes through Encode (with and without
// special-token parsing, under every pre-tokenizer and a SentencePiece-style vocabulary),
// Decode of arbitrary ids, the UTF-8 stream decoder, the raw pre-tokenizers and the
// chat-template parser.
//
// Beyond "no crash, no sanitizer report" it checks invariants and traps on a violation:
// valid UTF-8 encodes and decodes back to itself (SPM: unless it holds a literal U+2581,
// which decodes as a space), invalid UTF-8 is rejected, pre-tokens
// are non-empty and cover the input, and the stream decoder only ever emits valid UTF-8.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode_data.h"

namespace {

using specnode::Tokenizer;
using specnode::TokenizerSpec;
using specnode::tokenizer_internal::PreTokenizer;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

std::string ByteChar(int b) {
  auto printable = [](int x) {
    return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
  };
  char32_t cp = static_cast<char32_t>(b);
  if (!printable(b)) {
    cp = 256;
    for (int x = 0; x < b; ++x) cp += printable(x) ? 0 : 1;
  }
  std::string out;
  specnode::unicode::AppendUtf8(cp, &out);
  return out;
}

// 256 byte tokens, a few merges (including across the byte-level space "Ġ"), control and
// user-defined tokens that overlap, for one pre-tokenizer.
std::unique_ptr<Tokenizer> Build(const char* pre) {
  TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(ByteChar(b));
  const std::string g = ByteChar(' ');
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"t", "h"}, {"th", "e"}, {g, "the"}, {"a", "a"}, {"aa", "aa"},  {g, "a"},
      {"1", "2"}, {"12", "3"}, {"Ã", "©"}, {g, g},     {g + g, g + g}};
  for (const auto& [l, r] : merges) {
    spec.merges.push_back(l + " " + r);
    if (spec.tokens.end() == std::find(spec.tokens.begin(), spec.tokens.end(), l + r)) {
      spec.tokens.push_back(l + r);
    }
  }
  spec.token_types.assign(spec.tokens.size(), 1);
  for (const char* special : {"<|im_end|>", "<|im_start|>", "<|im", "<s>"}) {
    spec.tokens.push_back(special);
    spec.token_types.push_back(3);
  }
  spec.tokens.push_back("<user>");
  spec.token_types.push_back(4);
  spec.eos_id = static_cast<int32_t>(spec.tokens.size()) - 5;
  spec.pre = pre;
  auto tok = Tokenizer::Create(std::move(spec));
  Check(tok.ok());
  return std::move(*tok);
}

// SPM: byte tokens, scored pieces over "▁" (U+2581) with equal scores among them,
// user-defined whitespace runs and tags, control tokens that overlap; no space prefix.
std::unique_ptr<Tokenizer> BuildSpm() {
  const std::string sp = "\xe2\x96\x81";
  TokenizerSpec spec;
  spec.model = specnode::TokenizerModel::kSpm;
  spec.tokens = {"<unk>", "<s>", "</s>"};
  spec.token_types = {2, 3, 3};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    spec.tokens.push_back(buf);
    spec.token_types.push_back(6);
  }
  for (const std::string& p : std::vector<std::string>{
           sp, sp + sp, "t", "h", "e", "th", "the", sp + "the", "a", "aa", "aaaa", sp + "a",
           std::string("\xc3\xa9"), "\xe4\xbd\xa0\xe5\xa5\xbd", "12", "123", "\n"}) {
    spec.tokens.push_back(p);
    spec.token_types.push_back(1);
  }
  for (const char* p : {"  ", "   ", "\n\n", "<b>", "</b>"}) {
    spec.tokens.push_back(p);
    spec.token_types.push_back(4);
  }
  for (const char* p : {"<start_of_turn>", "<start", "<end_of_turn>"}) {
    spec.tokens.push_back(p);
    spec.token_types.push_back(3);
  }
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    spec.scores.push_back(spec.token_types[i] == 1 ? -static_cast<float>(i % 7) : 0.0f);
  }
  spec.unk_id = 0;
  spec.bos_id = 1;
  spec.eos_id = 2;
  auto tok = Tokenizer::Create(std::move(spec));
  Check(tok.ok());
  return std::move(*tok);
}

bool ValidUtf8(std::string_view s) {
  return specnode::unicode::FindInvalidUtf8(s) == std::string_view::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<Tokenizer> toks[] = {Build("gpt2"), Build("smollm"),
                                                    Build("llama-bpe"), Build("qwen2"), BuildSpm()};
  static const PreTokenizer kinds[] = {PreTokenizer::kGpt2, PreTokenizer::kSmolLm,
                                       PreTokenizer::kLlama3, PreTokenizer::kQwen2};
  if (size == 0) return 0;
  // Bits 0-1 pick the BPE tokenizer (and pre-tokenizer), bit 3 the SPM one instead.
  const int which = data[0] & 3;
  const bool spm = (data[0] & 8) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const Tokenizer& tok = spm ? *toks[4] : *toks[which];
  const bool valid = ValidUtf8(text);
  const bool lossless = !spm || text.find("\xe2\x96\x81") == std::string_view::npos;

  for (bool special : {false, true}) {
    auto ids = tok.Encode(text, special);
    Check(ids.ok() == valid);
    if (!ids.ok()) continue;
    for (int32_t id : *ids) Check(id >= 0 && id < tok.vocab_size());
    if (lossless) Check(tok.Decode(*ids, /*render_special=*/special) == text);
  }

  std::vector<std::string_view> pieces;
  specnode::tokenizer_internal::PreTokenize(kinds[which], text, &pieces);
  size_t covered = 0;
  for (std::string_view p : pieces) {
    Check(!p.empty() && p.data() == text.data() + covered);
    covered += p.size();
  }
  Check(covered == text.size());

  // Arbitrary ids (out of range included) decode without error.
  std::vector<int32_t> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  (void)tok.Decode(raw, data[0] & 4);
  for (int32_t id : raw) (void)tok.IsEndOfGeneration(id);

  // Stream decoding in uneven chunks emits only valid UTF-8; for valid input, exactly it.
  specnode::Utf8StreamDecoder stream;
  std::string streamed;
  for (size_t pos = 0, step = 1; pos < text.size(); pos += step, step = step % 5 + 1) {
    const std::string out = stream.Push(text.substr(pos, step));
    Check(ValidUtf8(out));
    streamed += out;
  }
  const std::string tail = stream.Flush();
  Check(ValidUtf8(tail));
  streamed += tail;
  if (valid) Check(streamed == text);

  // The text as a chat template: never crashes; ChatML output keeps the user turn.
  auto chat = specnode::ApplyChatTemplate(std::string(text), {{"user", "hi"}}, true);
  if (chat.ok()) Check(!chat->empty());
  return 0;
}

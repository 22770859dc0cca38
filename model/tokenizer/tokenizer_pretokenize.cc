// Hand-written matchers for the pre-tokenizer regexes declared in model/tokenizer.h.
//
// Each Match* function returns the end of the regex match that starts at character i of
// [i, end). The alternatives are tried in the regex's order, and where an alternative
// would backtrack (optional leading space, \s*[\r\n]+, \s+(?!\S)) the code computes the
// position the backtracking regex engine would settle on. Lookahead never sees past
// `end`: in SmolLM the digit split happens first and the regex runs on each span alone.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode_data.h"

namespace specnode::tokenizer_internal {
namespace {

using unicode::kLetter;
using unicode::kNumber;
using unicode::kWhitespace;

// The text as code points, each with its class flags and byte offset.
struct Chars {
  std::vector<char32_t> cp;
  std::vector<uint8_t> flags;
  std::vector<size_t> offset;  // size() + 1 entries; the last is the text's length

  size_t size() const { return cp.size(); }
  bool Letter(size_t i) const { return (flags[i] & kLetter) != 0; }
  bool Number(size_t i) const { return (flags[i] & kNumber) != 0; }
  bool Space(size_t i) const { return (flags[i] & kWhitespace) != 0; }
  // [^\s\p{L}\p{N}]
  bool Other(size_t i) const { return flags[i] == 0; }
  bool Newline(size_t i) const { return cp[i] == '\r' || cp[i] == '\n'; }
};

void Decode(std::string_view text, Chars* c) {
  c->cp.reserve(text.size());
  c->flags.reserve(text.size());
  c->offset.reserve(text.size() + 1);
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp = 0;
    int n = unicode::DecodeUtf8(text, pos, &cp);
    uint8_t flags = 0;
    if (n == 0) {
      // Invalid byte (callers validate first): one classless character, so that the
      // pieces still cover the text exactly.
      n = 1;
      cp = 0xFFFD;
    } else {
      flags = unicode::CharFlags(cp);
    }
    c->cp.push_back(cp);
    c->flags.push_back(flags);
    c->offset.push_back(pos);
    pos += static_cast<size_t>(n);
  }
  c->offset.push_back(text.size());
}

template <typename Pred>
size_t RunWhile(const Chars& c, size_t i, size_t end, Pred pred) {
  while (i < end && pred(i)) ++i;
  return i;
}

// \s+(?!\S)|\s+ at a whitespace character i.
size_t MatchTrailingSpace(const Chars& c, size_t i, size_t end) {
  const size_t k = RunWhile(c, i, end, [&](size_t j) { return c.Space(j); });
  if (k == end) return k;        // (?!\S) holds at the end of the text
  if (k - i >= 2) return k - 1;  // backtrack one so the lookahead sees whitespace
  return k;                      // \s+(?!\S) fails; plain \s+ takes the single char
}

// ASCII lowercase; with `long_s`, U+017F (long s) folds to 's' as Unicode case-insensitive
// matching (Oniguruma, Rust regex) does for (?i:'s).
char32_t Fold(char32_t cp, bool long_s) {
  if (cp >= 'A' && cp <= 'Z') return cp + ('a' - 'A');
  if (long_s && cp == 0x17F) return 's';
  return cp;
}

// 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive. Returns the end or i on no match.
size_t MatchContraction(const Chars& c, size_t i, size_t end, bool fold, bool long_s) {
  if (c.cp[i] != '\'' || i + 1 >= end) return i;
  auto at = [&](size_t j) { return fold ? Fold(c.cp[j], long_s) : c.cp[j]; };
  const char32_t c1 = at(i + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
  if (i + 2 >= end) return i;
  const char32_t c2 = at(i + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
    return i + 3;
  }
  return i;
}

size_t MatchGpt2(const Chars& c, size_t i, size_t end) {
  if (size_t m = MatchContraction(c, i, end, /*fold=*/false, false); m > i) return m;
  // " ?X+" for X in \p{L}, \p{N}, [^\s\p{L}\p{N}]: the space is taken when X follows it;
  // without the space the class would have to match ' ' itself, which none does.
  const size_t j = (c.cp[i] == ' ' && i + 1 < end) ? i + 1 : i;
  if (c.Letter(j)) return RunWhile(c, j, end, [&](size_t k) { return c.Letter(k); });
  if (c.Number(j)) return RunWhile(c, j, end, [&](size_t k) { return c.Number(k); });
  if (c.Other(j)) return RunWhile(c, j, end, [&](size_t k) { return c.Other(k); });
  // Only whitespace is left (a lone ' ' before whitespace, or any other \s).
  return MatchTrailingSpace(c, i, end);
}

size_t MatchLlama3(const Chars& c, size_t i, size_t end, size_t max_digits, bool long_s) {
  if (size_t m = MatchContraction(c, i, end, /*fold=*/true, long_s); m > i) return m;
  auto letters = [&](size_t k) { return c.Letter(k); };
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (!c.Newline(i) && !c.Letter(i) && !c.Number(i) && i + 1 < end && c.Letter(i + 1)) {
    return RunWhile(c, i + 1, end, letters);
  }
  if (c.Letter(i)) return RunWhile(c, i, end, letters);
  // \p{N}{1,N}
  if (c.Number(i)) {
    size_t k = i;
    while (k < end && k - i < max_digits && c.Number(k)) ++k;
    return k;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  const size_t j = (c.cp[i] == ' ' && i + 1 < end) ? i + 1 : i;
  if (c.Other(j)) {
    const size_t k = RunWhile(c, j, end, [&](size_t q) { return c.Other(q); });
    return RunWhile(c, k, end, [&](size_t q) { return c.Newline(q); });
  }
  // i is whitespace. \s*[\r\n]+: \s* backs off to the last \r or \n of the run, and
  // [\r\n]+ then takes just that one (the next character is not \r/\n or not \s).
  const size_t k = RunWhile(c, i, end, [&](size_t q) { return c.Space(q); });
  for (size_t q = k; q > i; --q) {
    if (c.Newline(q - 1)) return q;
  }
  return MatchTrailingSpace(c, i, end);
}

void Emit(std::string_view text, const Chars& c, size_t from, size_t to,
          std::vector<std::string_view>* out) {
  out->push_back(text.substr(c.offset[from], c.offset[to] - c.offset[from]));
}

}  // namespace

absl::StatusOr<PreTokenizer> ParsePreTokenizer(std::string_view name) {
  if (name == "gpt2" || name == "gpt-2") return PreTokenizer::kGpt2;
  if (name == "smollm") return PreTokenizer::kSmolLm;
  if (name == "llama-bpe" || name == "llama3") return PreTokenizer::kLlama3;
  if (name == "qwen2") return PreTokenizer::kQwen2;
  return absl::InvalidArgumentError(absl::StrCat("unsupported pre-tokenizer '", std::string(name),
                                                 "' (supported: gpt2, smollm, llama-bpe, qwen2)"));
}

void PreTokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>* out) {
  Chars c;
  Decode(text, &c);
  const size_t n = c.size();
  auto run = [&](size_t begin, size_t end) {
    size_t i = begin;
    while (i < end) {
      size_t next = 0;
      switch (kind) {
        case PreTokenizer::kGpt2:
        case PreTokenizer::kSmolLm:
          next = MatchGpt2(c, i, end);
          break;
        case PreTokenizer::kLlama3:
          next = MatchLlama3(c, i, end, 3, /*long_s=*/true);
          break;
        case PreTokenizer::kQwen2:
          next = MatchLlama3(c, i, end, 1, /*long_s=*/false);
          break;
      }
      if (next <= i) next = i + 1;  // unreachable: every character matches something
      Emit(text, c, i, next, out);
      i = next;
    }
  };
  if (kind != PreTokenizer::kSmolLm) {
    run(0, n);
    return;
  }
  size_t begin = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!c.Number(i)) continue;
    run(begin, i);
    Emit(text, c, i, i + 1, out);
    begin = i + 1;
  }
  run(begin, n);
}

}  // namespace specnode::tokenizer_internal

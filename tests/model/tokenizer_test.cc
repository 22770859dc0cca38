#include "model/tokenizer/tokenizer.h"
#include "tests/model/tokenizer_test_util.h"
#include "tests/support/real_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf/gguf_reader.h"
#include "model/tokenizer/unicode_data.h"

namespace specnode {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using tokenizer_internal::PreTokenize;
using tokenizer_internal::PreTokenizer;

// GPT-2 byte-level character of a byte, UTF-8 encoded.
std::string ByteChar(uint8_t b) {
  const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
  char32_t cp = b;
  if (!printable) {
    cp = 256;
    for (int x = 0; x < b; ++x) {
      const bool p = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE;
      if (!p) ++cp;
    }
  }
  std::string out;
  unicode::AppendUtf8(cp, &out);
  return out;
}

// Ids 0..255 are the byte-level alphabet in byte order; `extra` follow from id 256.
TokenizerSpec MakeSpec(const std::vector<std::string>& extra,
                       const std::vector<std::string>& merges, std::string pre = "gpt2") {
  TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(ByteChar(static_cast<uint8_t>(b)));
  for (const std::string& t : extra) spec.tokens.push_back(t);
  spec.merges = merges;
  spec.pre = std::move(pre);
  return spec;
}

using testing_support::MustCreate;
using testing_support::MustEncode;

std::vector<std::string> Pieces(PreTokenizer kind, std::string_view text) {
  std::vector<std::string_view> views;
  PreTokenize(kind, text, &views);
  return std::vector<std::string>(views.begin(), views.end());
}

TEST(TokenizerTest, ByteLevelOnlyEncodesBytes) {
  auto tok = MustCreate(MakeSpec({}, {}));
  EXPECT_THAT(MustEncode(*tok, "hi", false), ElementsAre('h', 'i'));
  EXPECT_THAT(MustEncode(*tok, "\xc3\xa9", false), ElementsAre(0xC3, 0xA9));
  EXPECT_TRUE(MustEncode(*tok, "", false).empty());
}

TEST(TokenizerTest, MergesApplyByRank) {
  // "abc" with tokens ab, bc, abc: whichever merge ranks first wins.
  auto ab_first = MustCreate(MakeSpec({"ab", "bc", "abc"}, {"a b", "b c", "ab c"}));
  EXPECT_THAT(MustEncode(*ab_first, "abc", false), ElementsAre(258));
  auto bc_first = MustCreate(MakeSpec({"ab", "bc", "abc"}, {"b c", "a b", "a bc"}));
  EXPECT_THAT(MustEncode(*bc_first, "abc", false), ElementsAre(258));
  auto no_final = MustCreate(MakeSpec({"ab", "bc"}, {"b c", "a b"}));
  EXPECT_THAT(MustEncode(*no_final, "abc", false), ElementsAre('a', 257));
  auto no_final2 = MustCreate(MakeSpec({"ab", "bc"}, {"a b", "b c"}));
  EXPECT_THAT(MustEncode(*no_final2, "abc", false), ElementsAre(256, 'c'));
}

TEST(TokenizerTest, EqualRankMergesGoLeftmostFirst) {
  auto tok = MustCreate(MakeSpec({"aa"}, {"a a"}));
  EXPECT_THAT(MustEncode(*tok, "aaa", false), ElementsAre(256, 'a'));
  EXPECT_THAT(MustEncode(*tok, "aaaa", false), ElementsAre(256, 256));
}

TEST(TokenizerTest, MergesStayInsideWords) {
  // " b" is one word (space prefix), so "Ġ b" merges; "a" + "Ġ" never do.
  const std::string g = ByteChar(' ');
  auto tok = MustCreate(MakeSpec({g + "b", "a" + g}, {g + " b", "a " + g}));
  EXPECT_THAT(MustEncode(*tok, "a b", false), ElementsAre('a', 256));
  EXPECT_EQ(tok->Decode(MustEncode(*tok, "a b", false)), "a b");
}

TEST(TokenizerTest, SpecialTokensSplitOnlyWhenAsked) {
  TokenizerSpec spec = MakeSpec({"<a>", "<a>b", "<u>", "</s>"}, {});
  spec.token_types.assign(spec.tokens.size(), 1);
  spec.token_types[256] = 3;
  spec.token_types[257] = 3;
  spec.token_types[258] = 4;
  spec.token_types[259] = 3;
  spec.eos_id = 259;
  auto tok = MustCreate(spec);
  // Longest match at a position wins; matching is leftmost.
  EXPECT_THAT(MustEncode(*tok, "x<a>bc<a>", true), ElementsAre('x', 257, 'c', 256));
  EXPECT_THAT(MustEncode(*tok, "<u><a", true), ElementsAre(258, '<', 'a'));
  EXPECT_THAT(MustEncode(*tok, "<a>", false), ElementsAre('<', 'a', '>'));
  // Control tokens render only on request; user-defined always.
  const std::vector<int32_t> ids = {257, 'c', 258};
  EXPECT_EQ(tok->Decode(ids), "c<u>");
  EXPECT_EQ(tok->Decode(ids, /*render_special=*/true), "<a>bc<u>");
  EXPECT_EQ(tok->TokenToBytes(259), "");
  EXPECT_EQ(tok->TokenToBytes(259, true), "</s>");
  EXPECT_EQ(tok->TokenToBytes(-1), "");
  EXPECT_EQ(tok->TokenToBytes(100000), "");
  EXPECT_TRUE(tok->IsEndOfGeneration(259));
  EXPECT_FALSE(tok->IsEndOfGeneration(256));
  EXPECT_FALSE(tok->IsEndOfGeneration(-5));
  EXPECT_EQ(tok->FindToken("<a>b"), 257);
  EXPECT_EQ(tok->FindToken("nope"), -1);
}

TEST(TokenizerTest, EndOfGenerationControlTokens) {
  TokenizerSpec spec =
      MakeSpec({"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|im_start|>", "<end_of_turn>"}, {});
  spec.token_types.assign(spec.tokens.size(), 1);
  for (int i = 256; i < 261; ++i) spec.token_types[i] = 3;
  auto tok = MustCreate(spec);
  EXPECT_TRUE(tok->IsEndOfGeneration(256));
  EXPECT_TRUE(tok->IsEndOfGeneration(257));
  EXPECT_TRUE(tok->IsEndOfGeneration(258));
  EXPECT_FALSE(tok->IsEndOfGeneration(259));
  EXPECT_TRUE(tok->IsEndOfGeneration(260));  // Gemma's turn end
}

TEST(TokenizerTest, DropsBytesWithoutToken) {
  // As HF's BPE without unk: the byte goes, and its neighbours can then merge.
  TokenizerSpec spec = MakeSpec({"!!"}, {"! !"});
  spec.tokens[4] = "not a byte";
  auto tok = MustCreate(spec);
  EXPECT_THAT(MustEncode(*tok, "!\x04!", false), ElementsAre(256));
  EXPECT_THAT(MustEncode(*tok, "\x04", false), ElementsAre());
  EXPECT_THAT(MustEncode(*tok, "a\x04\x04", false), ElementsAre('a'));
}

TEST(TokenizerTest, AddsBos) {
  TokenizerSpec spec = MakeSpec({"<s>"}, {});
  spec.bos_id = 256;
  spec.add_bos = true;
  auto tok = MustCreate(spec);
  EXPECT_THAT(MustEncode(*tok, "a", false), ElementsAre(256, 'a'));
}

TEST(TokenizerTest, RejectsBadSpecs) {
  auto expect_invalid = [](TokenizerSpec spec, const std::string& needle) {
    auto tok = Tokenizer::Create(std::move(spec));
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(tok.status().message()), HasSubstr(needle));
  };
  expect_invalid(MakeSpec({}, {}, "mystery-pre"), "mystery-pre");
  expect_invalid(MakeSpec({"ab"}, {"a x"}), "merge 0");
  expect_invalid(MakeSpec({"ab"}, {"a b", "b a"}), "merge 1");  // "ba" not a token
  expect_invalid(MakeSpec({"ab"}, {"ab"}), "merge 0");
  expect_invalid(MakeSpec({"ab"}, {" "}), "merge 0");
  TokenizerSpec types = MakeSpec({}, {});
  types.token_types = {1, 1};
  expect_invalid(types, "token types");
  TokenizerSpec bad_type = MakeSpec({}, {});
  bad_type.token_types.assign(256, 1);
  bad_type.token_types[3] = 9;
  expect_invalid(bad_type, "type 9");
  TokenizerSpec bos = MakeSpec({}, {});
  bos.bos_id = 256;
  expect_invalid(bos, "bos");
  TokenizerSpec eos = MakeSpec({}, {});
  eos.eos_id = -7;
  expect_invalid(eos, "eos");
  expect_invalid(TokenizerSpec{}, "empty");
}

TEST(TokenizerTest, RejectsInvalidUtf8) {
  auto tok = MustCreate(MakeSpec({}, {}));
  for (std::string bad :
       {"\xff", "ok\xc3", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "a\x80", "\xe2\x82"}) {
    auto ids = tok->Encode(bad, false);
    ASSERT_FALSE(ids.ok()) << bad;
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_FALSE(tok->Encode(bad, true).ok());
  }
  EXPECT_TRUE(tok->Encode(std::string("nul\0inside", 10), false).ok());
}

TEST(TokenizerTest, DecodeRoundTrips) {
  auto tok =
      MustCreate(MakeSpec({"he", "hel", "hell", "hello"}, {"h e", "he l", "hel l", "hell o"}));
  for (const std::string& text :
       std::vector<std::string>{"hello world", "  \n\n  x", "héllo wörld 你好 😀", "a'b's 123 4.5",
                                "\t\r\n", std::string(3000, 'h')}) {
    EXPECT_EQ(tok->Decode(MustEncode(*tok, text, false)), text);
  }
  EXPECT_THAT(MustEncode(*tok, "hello", false), ElementsAre(259));
}

TEST(TokenizerTest, Llama3IgnoresMergesForWholeTokens) {
  // "abc" is a token but no merge chain reaches it; llama-bpe uses it directly.
  auto plain = MustCreate(MakeSpec({"ab", "abc"}, {"a b"}, "gpt2"));
  EXPECT_THAT(MustEncode(*plain, "abc", false), ElementsAre(256, 'c'));
  auto llama = MustCreate(MakeSpec({"ab", "abc"}, {"a b"}, "llama-bpe"));
  EXPECT_THAT(MustEncode(*llama, "abc", false), ElementsAre(257));
}

TEST(Utf8StreamDecoderTest, HoldsBackSplitCharacters) {
  Utf8StreamDecoder d;
  EXPECT_EQ(d.Push("a\xc3"), "a");
  EXPECT_EQ(d.Push("\xa9"), "\xc3\xa9");
  const std::string emoji = "\xf0\x9f\x98\x80";
  EXPECT_EQ(d.Push(emoji.substr(0, 1)), "");
  EXPECT_EQ(d.Push(emoji.substr(1, 2)), "");
  EXPECT_EQ(d.Push(emoji.substr(3) + "b"), emoji + "b");
  EXPECT_EQ(d.Flush(), "");
}

TEST(Utf8StreamDecoderTest, ReplacesInvalidBytes) {
  Utf8StreamDecoder d;
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_EQ(d.Push("x\xffy"), "x" + fffd + "y");
  EXPECT_EQ(d.Push("\xe2\x82z"), fffd + "z");             // maximal subpart -> one U+FFFD
  EXPECT_EQ(d.Push("\xed\xa0\x80"), fffd + fffd + fffd);  // surrogate: lead, then 2 strays
  EXPECT_EQ(d.Push("\xe4\xbd"), "");
  EXPECT_EQ(d.Flush(), fffd);
  EXPECT_EQ(d.Flush(), "");
}

TEST(PreTokenizeTest, WhitespaceBacktracking) {
  EXPECT_THAT(Pieces(PreTokenizer::kGpt2, "  \n\n  x"), ElementsAre("  \n\n ", " x"));
  EXPECT_THAT(Pieces(PreTokenizer::kGpt2, "a  b"), ElementsAre("a", " ", " b"));
  EXPECT_THAT(Pieces(PreTokenizer::kGpt2, "a \tb"), ElementsAre("a", " ", "\t", "b"));
  EXPECT_THAT(Pieces(PreTokenizer::kGpt2, "x  "), ElementsAre("x", "  "));
  EXPECT_THAT(Pieces(PreTokenizer::kGpt2, "don't I'M"), ElementsAre("don", "'t", " I", "'", "M"));
  EXPECT_THAT(Pieces(PreTokenizer::kLlama3, "I'M  \n\n  x 12345"),
              ElementsAre("I", "'M", "  \n\n", " ", " x", " ", "123", "45"));
  EXPECT_THAT(Pieces(PreTokenizer::kQwen2, "12 'S"), ElementsAre("1", "2", " '", "S"));
  EXPECT_THAT(Pieces(PreTokenizer::kSmolLm, "a 12b"), ElementsAre("a", " ", "1", "2", "b"));
  EXPECT_TRUE(Pieces(PreTokenizer::kSmolLm, "").empty());
}

TEST(PreTokenizeTest, ToleratesInvalidUtf8) {
  const std::string bad = "a\xff\xc3 b\xe2\x82";
  for (auto kind :
       {PreTokenizer::kGpt2, PreTokenizer::kSmolLm, PreTokenizer::kLlama3, PreTokenizer::kQwen2}) {
    std::string joined;
    for (const std::string& p : Pieces(kind, bad)) joined += p;
    EXPECT_EQ(joined, bad);
  }
}

// Every supported pre-tokenizer against Hugging Face `tokenizers` splitting the same texts
// with the published regexes (tests/data/make_pretokenizer_golden.py; 20 texts: contractions
// in both cases, digit runs, whitespace and newline runs, code, CJK, Hangul, Greek,
// Cyrillic, emoji).
TEST(PreTokenizeTest, MatchesHfTokenizers) {
  const auto path =
      std::filesystem::path(__FILE__).parent_path() / "../data/pretokenizer_golden.json";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "cannot open " << path;
  const nlohmann::json golden = nlohmann::json::parse(in);
  int checked = 0;
  for (const nlohmann::json& c : golden["cases"]) {
    auto kind = tokenizer_internal::ParsePreTokenizer(c["pre"].get<std::string>());
    ASSERT_TRUE(kind.ok()) << kind.status();
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(Pieces(*kind, text), c["pieces"].get<std::vector<std::string>>())
        << c["pre"].get<std::string>() << ": " << nlohmann::json(text).dump();
    ++checked;
  }
  EXPECT_EQ(checked, 80);
}

// ---- Golden data from tests/data/make_tokenizer_golden.py (HF tokenizers) ----

nlohmann::json LoadGolden() {
  const auto path = std::filesystem::path(__FILE__).parent_path() / "../data/tokenizer_golden.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  if (!in.good()) return nlohmann::json::object();
  return nlohmann::json::parse(in);
}

TEST(PreTokenizeGoldenTest, MatchesHuggingFaceRegexSplits) {
  const nlohmann::json golden = LoadGolden();
  ASSERT_TRUE(golden.contains("pretokenize"));
  int checked = 0;
  for (const auto& c : golden["pretokenize"]) {
    auto kind = tokenizer_internal::ParsePreTokenizer(c["pre"].get<std::string>());
    ASSERT_TRUE(kind.ok()) << kind.status();
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(Pieces(*kind, text), c["pieces"].get<std::vector<std::string>>())
        << c["pre"] << " on " << nlohmann::json(text).dump();
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

const Tokenizer* RealTokenizer() { return testing_support::RealTokenizer("SPECNODE_MODEL"); }
#define SKIP_WITHOUT_MODEL() SPECNODE_SKIP_WITHOUT_REAL_MODEL("SPECNODE_MODEL")

TEST(RealTokenizerTest, MatchesGolden) {
  SKIP_WITHOUT_MODEL();
  const Tokenizer* tok = RealTokenizer();
  ASSERT_NE(tok, nullptr);
  const nlohmann::json golden = LoadGolden();
  ASSERT_EQ(tok->vocab_size(), golden["vocab_size"].get<int>());
  EXPECT_EQ(tok->spec().pre, "smollm");
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_FALSE(tok->spec().add_bos);
  EXPECT_TRUE(tok->IsEndOfGeneration(2));
  EXPECT_TRUE(tok->IsEndOfGeneration(0));  // <|endoftext|>
  EXPECT_FALSE(tok->IsEndOfGeneration(1));
  int checked = 0;
  for (const auto& c : golden["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const bool special = c["parse_special"].get<bool>();
    auto ids = tok->Encode(text, special);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>())
        << "text " << nlohmann::json(text).dump() << " parse_special " << special;
    if (!c.value("lossy", false)) {
      EXPECT_EQ(tok->Decode(*ids, /*render_special=*/special), text);
    }
    ++checked;
  }
  EXPECT_GT(checked, 60);
}

TEST(RealTokenizerTest, EncodesLongPromptQuickly) {
  SKIP_WITHOUT_MODEL();
  const Tokenizer* tok = RealTokenizer();
  ASSERT_NE(tok, nullptr);
  testing_support::ExpectLongPromptEncodesQuickly(
      *tok, "The quick brown fox jumps over the lazy dog 1234 times; naïve café 你好!\n");
}

}  // namespace
}  // namespace specnode

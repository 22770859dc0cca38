// SentencePiece-style (SPM) tokenizer: hand-built scored vocabularies, GGUF loading, and
// (with SPECNODE_GEMMA_MODEL) Gemma 3's real vocabulary against llama.cpp's encodings in
// tests/data/gemma3-tokenizer-golden.json (tests/data/make_gemma_tokenizer_golden.py).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "model/gguf/gguf_reader.h"
#include "model/gguf/gguf_writer.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/tokenizer_spm.h"
#include "tests/model/tokenizer_test_util.h"
#include "tests/support/real_model.h"

namespace specnode {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const std::string kSp = "\xe2\x96\x81";  // U+2581, SentencePiece's space

constexpr int32_t kUnk = 0, kBos = 1, kEos = 2;
constexpr int32_t Byte(int b) { return 3 + b; }  // <0x00>.. are ids 3..258
constexpr int32_t kFirstPiece = 259;

// 0 <unk> (unknown), 1 <s> and 2 </s> (control), 3..258 <0x00>..<0xFF> (byte), then
// `pieces` (normal, with their scores) from id 259, in order.
TokenizerSpec SpmSpec(const std::vector<std::pair<std::string, float>>& pieces,
                      bool space_prefix = false) {
  TokenizerSpec spec;
  spec.model = TokenizerModel::kSpm;
  spec.tokens = {"<unk>", "<s>", "</s>"};
  spec.token_types = {2, 3, 3};
  spec.scores = {0, 0, 0};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    spec.tokens.push_back(buf);
    spec.token_types.push_back(6);
    spec.scores.push_back(0);
  }
  for (const auto& [text, score] : pieces) {
    spec.tokens.push_back(text);
    spec.token_types.push_back(1);
    spec.scores.push_back(score);
  }
  spec.unk_id = kUnk;
  spec.bos_id = kBos;
  spec.eos_id = kEos;
  spec.add_space_prefix = space_prefix;
  spec.pre = "default";  // as Gemma's file says; not a BPE pre-tokenizer name
  return spec;
}

using testing_support::MustCreate;
using testing_support::MustEncode;

TEST(SpmTokenizerTest, MergesHighestScoreFirst) {
  // "abc" without an "abc" token: whichever pair scores higher is merged.
  auto ab_first = MustCreate(SpmSpec({{"a", -5}, {"b", -5}, {"c", -5}, {"ab", -1}, {"bc", -2}}));
  EXPECT_THAT(MustEncode(*ab_first, "abc", false), ElementsAre(262, 261));
  auto bc_first = MustCreate(SpmSpec({{"a", -5}, {"b", -5}, {"c", -5}, {"ab", -2}, {"bc", -1}}));
  EXPECT_THAT(MustEncode(*bc_first, "abc", false), ElementsAre(259, 263));
  // Merged symbols keep merging, whatever the final token's own score.
  auto chain = MustCreate(SpmSpec({{"ab", -1}, {"cd", -2}, {"abcd", -100}}));
  EXPECT_THAT(MustEncode(*chain, "abcd", false), ElementsAre(261));
  // The better pair "bc" takes the "b"; "a" (no piece) is left to its byte.
  auto blocked = MustCreate(SpmSpec({{"ab", -2}, {"bc", -1}}));
  EXPECT_THAT(MustEncode(*blocked, "abc", false), ElementsAre(Byte('a'), 260));
}

TEST(SpmTokenizerTest, EqualScoresMergeLeftmostFirst) {
  auto tok = MustCreate(SpmSpec({{"a", -1}, {"aa", -1}}));
  EXPECT_THAT(MustEncode(*tok, "aaa", false), ElementsAre(260, 259));
  EXPECT_THAT(MustEncode(*tok, "aaaa", false), ElementsAre(260, 260));
}

TEST(SpmTokenizerTest, MultiByteCharactersAreSymbols) {
  // "é" is one symbol; "né" merges as two characters, not three bytes.
  auto tok = MustCreate(SpmSpec({{"n", -1}, {"\xc3\xa9", -1}, {"n\xc3\xa9", -1}}));
  EXPECT_THAT(MustEncode(*tok, "n\xc3\xa9", false), ElementsAre(261));
  EXPECT_THAT(MustEncode(*tok, "\xc3\xa9n", false), ElementsAre(260, 259));
}

TEST(SpmTokenizerTest, UnknownPiecesFallBackToBytes) {
  auto tok = MustCreate(SpmSpec({{"a", -1}}));
  EXPECT_THAT(MustEncode(*tok, "a\xc3\xa9", false), ElementsAre(259, Byte(0xC3), Byte(0xA9)));
  EXPECT_THAT(MustEncode(*tok, "\xf0\x9f\x98\x80", false),  // U+1F600
              ElementsAre(Byte(0xF0), Byte(0x9F), Byte(0x98), Byte(0x80)));
  EXPECT_THAT(MustEncode(*tok, std::string("\0", 1), false), ElementsAre(Byte(0)));
  EXPECT_EQ(tok->Decode(MustEncode(*tok, "a\xc3\xa9", false)), "a\xc3\xa9");
  EXPECT_EQ(tok->TokenToBytes(Byte(0xC3)), "\xc3");

  // No <0xNN> tokens: a one-byte token, else <unk>.
  TokenizerSpec spec;
  spec.model = TokenizerModel::kSpm;
  spec.tokens = {"<unk>", "x"};
  spec.token_types = {2, 1};
  spec.scores = {0, -1};
  spec.unk_id = 0;
  auto no_bytes = MustCreate(spec);
  EXPECT_THAT(MustEncode(*no_bytes, "x\xc3\xa9", false), ElementsAre(1, 0, 0));
  spec.unk_id = -1;
  auto no_unk = MustCreate(spec);
  EXPECT_THAT(MustEncode(*no_unk, "x\xc3\xa9x", false), ElementsAre(1, 1));
}

TEST(SpmTokenizerTest, SpacesBecomeU2581AndPrefixIsOptional) {
  const std::vector<std::pair<std::string, float>> pieces = {
      {kSp, -3}, {"a", -4}, {"b", -4}, {kSp + "a", -1}, {kSp + "b", -1}};
  auto plain = MustCreate(SpmSpec(pieces, /*space_prefix=*/false));
  EXPECT_THAT(MustEncode(*plain, "a b", false), ElementsAre(260, 263));
  EXPECT_THAT(MustEncode(*plain, "a  b", false), ElementsAre(260, 259, 263));
  EXPECT_THAT(MustEncode(*plain, "a\tb", false), ElementsAre(260, Byte('\t'), 261));
  auto prefixed = MustCreate(SpmSpec(pieces, /*space_prefix=*/true));
  EXPECT_THAT(MustEncode(*prefixed, "a b", false), ElementsAre(262, 263));
  EXPECT_THAT(MustEncode(*prefixed, " a", false), ElementsAre(259, 262));
  EXPECT_TRUE(MustEncode(*prefixed, "", false).empty());
  // Every span after a special token gets the prefix too; an empty span gets nothing.
  EXPECT_THAT(MustEncode(*prefixed, "a<s>b", true), ElementsAre(262, kBos, 263));
  EXPECT_THAT(MustEncode(*prefixed, "<s><s>a", true), ElementsAre(kBos, kBos, 262));
  EXPECT_THAT(MustEncode(*prefixed, "a<s>", true), ElementsAre(262, kBos));
}

TEST(SpmTokenizerTest, DecodeDropsThePrefixSpaceOfTheFirstPieceOnly) {
  const std::vector<std::pair<std::string, float>> pieces = {{kSp + "a", -1}, {kSp + "b", -1}};
  auto prefixed = MustCreate(SpmSpec(pieces, /*space_prefix=*/true));
  EXPECT_EQ(prefixed->Decode(std::vector<int32_t>{259, 260}), "a b");
  EXPECT_EQ(prefixed->Decode(std::vector<int32_t>{259, 259}), "a a");
  EXPECT_EQ(prefixed->Decode(std::vector<int32_t>{Byte(' '), 260}), " b");
  // As llama.cpp's detokenize without remove_special: a leading BOS keeps the space.
  EXPECT_EQ(prefixed->Decode(std::vector<int32_t>{kBos, 259}), " a");
  EXPECT_EQ(prefixed->Decode(std::vector<int32_t>{kBos, 259}, /*render_special=*/true), "<s> a");
  EXPECT_EQ(prefixed->TokenToBytes(259), " a");  // streaming pieces are never stripped
  auto plain = MustCreate(SpmSpec(pieces, /*space_prefix=*/false));
  EXPECT_EQ(plain->Decode(std::vector<int32_t>{259, 260}), " a b");
}

TEST(SpmTokenizerTest, UserDefinedTokensAlwaysMatchControlOnlyWhenAsked) {
  TokenizerSpec spec = SpmSpec({{"a", -1}, {"b", -1}});
  for (const char* t : {"  ", "<tag>", "<ctl>"}) {
    spec.tokens.push_back(t);
    spec.scores.push_back(-1000);
    spec.token_types.push_back(4);
  }
  spec.token_types.back() = 3;  // <ctl> is a control token
  auto tok = MustCreate(spec);
  EXPECT_THAT(MustEncode(*tok, "a  b<tag>", false), ElementsAre(259, 261, 260, 262));
  EXPECT_THAT(MustEncode(*tok, "a<ctl>", true), ElementsAre(259, 263));
  const std::vector<int32_t> literal = MustEncode(*tok, "a<ctl>", false);
  EXPECT_EQ(literal.size(), 6u);
  EXPECT_EQ(tok->Decode(literal), "a<ctl>");
  EXPECT_THAT(MustEncode(*tok, "<s><unk>", true), ElementsAre(kBos, kUnk));
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{259, 261, 263}), "a  ");
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{259, 261, 263}, true), "a  <ctl>");
}

TEST(SpmTokenizerTest, AddsBosAndEos) {
  TokenizerSpec spec = SpmSpec({{"a", -1}});
  spec.add_bos = true;
  spec.add_eos = true;
  auto tok = MustCreate(spec);
  EXPECT_THAT(MustEncode(*tok, "a", false), ElementsAre(kBos, 259, kEos));
  EXPECT_THAT(MustEncode(*tok, "", true), ElementsAre(kBos, kEos));
  EXPECT_TRUE(tok->IsEndOfGeneration(kEos));
}

TEST(SpmTokenizerTest, DecodeRoundTrips) {
  std::vector<std::pair<std::string, float>> pieces;
  for (const char* p : {"h", "e", "l", "o", "he", "ll", "hell", "hello", "w", "r", "d", "wor",
                        "world", "\xe4\xbd\xa0", "\xe4\xbd\xa0\xe5\xa5\xbd", "\n", "\n\n"}) {
    pieces.push_back({p, -static_cast<float>(pieces.size())});
  }
  for (const char* p : {"", "h", "hello", "w", "world", "\xe4\xbd\xa0"}) {
    pieces.push_back({kSp + p, -0.5f - static_cast<float>(pieces.size())});
  }
  const std::vector<std::string> texts = {
      "hello world",
      "  hello   world  ",
      " ",
      "\n\n\nhello\n",
      "\t\r\n\v\f",
      "h\xc3\xa9llo w\xc3\xb6rld \xe4\xbd\xa0\xe5\xa5\xbd \xe4\xbd\xa0 \xf0\x9f\x98\x80",
      "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9 \xf0\x9f\x87\xab\xf0\x9f\x87\xb7",
      "\xe2\x80\x83 em space, \xc2\xa0 no-break space",
      std::string("nul\0inside", 10),
      std::string(2000, 'l') + " " + std::string(100, ' '),
  };
  for (bool prefix : {false, true}) {
    auto tok = MustCreate(SpmSpec(pieces, prefix));
    for (const std::string& text : texts) {
      EXPECT_EQ(tok->Decode(MustEncode(*tok, text, false)), text)
          << nlohmann::json(text).dump() << " prefix " << prefix;
      EXPECT_EQ(tok->Decode(MustEncode(*tok, text, true)), text);
    }
  }
  auto tok = MustCreate(SpmSpec(pieces));
  EXPECT_THAT(MustEncode(*tok, "hello", false), ElementsAre(266));
  // No "wo" piece, so "wor"/"world" are out of reach from "\u2581w" + "o".
  EXPECT_THAT(MustEncode(*tok, "hello world", false), ElementsAre(266, 279, 262, 268, 261, 269));
  // A literal U+2581 is indistinguishable from an escaped space (as in llama.cpp).
  EXPECT_EQ(tok->Decode(MustEncode(*tok, kSp + "w", false)), " w");
}

TEST(SpmTokenizerTest, RejectsBadSpecs) {
  auto expect_invalid = [](TokenizerSpec spec, const std::string& needle) {
    auto tok = Tokenizer::Create(std::move(spec));
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(tok.status().message()), HasSubstr(needle));
  };
  TokenizerSpec few = SpmSpec({{"a", -1}});
  few.scores.pop_back();
  expect_invalid(few, "scores");
  TokenizerSpec nan = SpmSpec({{"a", -1}});
  nan.scores.back() = std::numeric_limits<float>::quiet_NaN();
  expect_invalid(nan, "NaN");
  TokenizerSpec bos = SpmSpec({});
  bos.bos_id = 100000;
  expect_invalid(bos, "bos");
  TokenizerSpec eos = SpmSpec({});
  eos.eos_id = -1;
  eos.add_eos = true;
  expect_invalid(eos, "add_eos");
  TokenizerSpec inf = SpmSpec({{"a", -std::numeric_limits<float>::infinity()}});
  EXPECT_TRUE(Tokenizer::Create(inf).ok());
}

TEST(SpmTokenizerTest, HelpersEscapeAndParseBytes) {
  std::string out;
  tokenizer_internal::SpmEscape("a b  c", true, &out);
  EXPECT_EQ(out, kSp + "a" + kSp + "b" + kSp + kSp + "c");
  EXPECT_EQ(tokenizer_internal::SpmUnescape(out), " a b  c");
  EXPECT_EQ(tokenizer_internal::ParseByteToken("<0x0A>"), 10);
  EXPECT_EQ(tokenizer_internal::ParseByteToken("<0xff>"), 255);
  EXPECT_EQ(tokenizer_internal::ParseByteToken("<0x1>"), -1);
  EXPECT_EQ(tokenizer_internal::ParseByteToken("<0xG0>"), -1);
  EXPECT_EQ(tokenizer_internal::ParseByteToken("0x41"), -1);
}

// ---- From GGUF metadata ----

std::string SpmGguf(bool with_scores, bool with_ids, const std::string& model = "llama") {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddString("tokenizer.ggml.model", model);
  w.AddString("tokenizer.ggml.pre", "default");
  w.AddStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", kSp + "a", "a", kSp});
  if (with_scores) w.AddFloat32Array("tokenizer.ggml.scores", {0, 0, 0, -1, -2, -3});
  w.AddInt32Array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1});
  if (with_ids) {
    w.AddUint32("tokenizer.ggml.bos_token_id", 2);
    w.AddUint32("tokenizer.ggml.eos_token_id", 1);
    w.AddBool("tokenizer.ggml.add_bos_token", false);
    w.AddBool("tokenizer.ggml.add_eos_token", true);
    w.AddBool("tokenizer.ggml.add_space_prefix", false);
  }
  return w.Serialize();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> FromBytes(const std::string& bytes) {
  auto file = GgufFile::FromBytes(bytes);
  if (!file.ok()) return file.status();
  return Tokenizer::FromGguf(**file);
}

TEST(SpmTokenizerTest, LoadsFromGgufWithLlamaCppDefaults) {
  auto tok = FromBytes(SpmGguf(true, false));
  ASSERT_TRUE(tok.ok()) << tok.status();
  const TokenizerSpec& spec = (*tok)->spec();
  EXPECT_EQ(spec.model, TokenizerModel::kSpm);
  EXPECT_EQ(spec.bos_id, 1);
  EXPECT_EQ(spec.eos_id, 2);
  EXPECT_EQ(spec.unk_id, 0);
  EXPECT_TRUE(spec.add_bos);
  EXPECT_FALSE(spec.add_eos);
  EXPECT_TRUE(spec.add_space_prefix);
  EXPECT_THAT(MustEncode(**tok, "a a", false), ElementsAre(1, 3, 3));
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{3, 3}), "a a");

  auto set = FromBytes(SpmGguf(true, true));
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ((*set)->bos_id(), 2);
  EXPECT_EQ((*set)->eos_id(), 1);
  EXPECT_THAT(MustEncode(**set, "a a", false), ElementsAre(4, 3, 1));
}

TEST(SpmTokenizerTest, GgufWithoutScoresOrWithAnUnknownModelIsRefused) {
  auto no_scores = FromBytes(SpmGguf(false, true));
  ASSERT_FALSE(no_scores.ok());
  EXPECT_EQ(no_scores.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(no_scores.status().message()), HasSubstr("tokenizer.ggml.scores"));
  auto bert = FromBytes(SpmGguf(true, true, "bert"));
  ASSERT_FALSE(bert.ok());
  EXPECT_EQ(bert.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(bert.status().message()), HasSubstr("bert"));
}

// ---- Gemma 3's real vocabulary vs llama.cpp ----

nlohmann::json LoadGemmaGolden() {
  const auto path =
      std::filesystem::path(__FILE__).parent_path() / "../data/gemma3-tokenizer-golden.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  if (!in.good()) return nlohmann::json::object();
  return nlohmann::json::parse(in);
}

const Tokenizer* GemmaTokenizer() { return testing_support::RealTokenizer("SPECNODE_GEMMA_MODEL"); }
#define SKIP_WITHOUT_GEMMA() SPECNODE_SKIP_WITHOUT_REAL_MODEL("SPECNODE_GEMMA_MODEL")

TEST(GemmaTokenizerTest, MatchesLlamaCppGolden) {
  SKIP_WITHOUT_GEMMA();
  const Tokenizer* tok = GemmaTokenizer();
  ASSERT_NE(tok, nullptr);
  const nlohmann::json golden = LoadGemmaGolden();
  ASSERT_EQ(tok->vocab_size(), golden["vocab_size"].get<int>());
  EXPECT_EQ(tok->spec().model, TokenizerModel::kSpm);
  EXPECT_EQ(tok->bos_id(), 2);
  EXPECT_EQ(tok->eos_id(), 1);
  EXPECT_TRUE(tok->spec().add_bos);
  EXPECT_FALSE(tok->spec().add_space_prefix);
  EXPECT_TRUE(tok->IsEndOfGeneration(1));    // <eos>
  EXPECT_TRUE(tok->IsEndOfGeneration(106));  // <end_of_turn>
  EXPECT_FALSE(tok->IsEndOfGeneration(105));
  // "</s>" is a user-defined token here (HTML, beside <s> 203), always split out and not an
  // end of generation, as the file types it; llama.cpp re-types it as control by its text.
  EXPECT_THAT(MustEncode(*tok, "x</s>", false), ElementsAre(2, 236781, 212));
  EXPECT_FALSE(tok->IsEndOfGeneration(212));
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{212}), "</s>");
  int checked = 0;
  for (const auto& c : golden["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const bool special = c["parse_special"].get<bool>();
    auto ids = tok->Encode(text, special);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>())
        << "text " << nlohmann::json(text).dump() << " parse_special " << special;
    EXPECT_EQ(tok->Decode(c["ids"].get<std::vector<int32_t>>(), special),
              c["decoded"].get<std::string>())
        << "decode of " << nlohmann::json(text).dump() << " render_special " << special;
    ++checked;
  }
  EXPECT_GE(checked, 60);
}

TEST(GemmaTokenizerTest, EncodesLongPromptQuickly) {
  SKIP_WITHOUT_GEMMA();
  const Tokenizer* tok = GemmaTokenizer();
  ASSERT_NE(tok, nullptr);
  testing_support::ExpectLongPromptEncodesQuickly(
      *tok, "The quick brown fox <b>jumps</b> over the lazy dog 1234 times; naïve café 你好!\n");
}

}  // namespace
}  // namespace specnode

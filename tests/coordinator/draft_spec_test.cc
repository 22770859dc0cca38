// DraftSpec: parsed once from its text, printed back the same.
#include "coordinator/draft_spec.h"

#include "gtest/gtest.h"

namespace specnode {
namespace {

TEST(DraftSpecTest, ParsesEveryKindAndPrintsItBack) {
  struct Case {
    const char* text;
    DraftSpec::Kind kind;
    int count;
  };
  for (const Case& c :
       {Case{"none", DraftSpec::Kind::kNone, 0}, Case{"ngram", DraftSpec::Kind::kNgram, 0},
        Case{"ngram:3", DraftSpec::Kind::kNgram, 3}, Case{"suffix", DraftSpec::Kind::kSuffix, 0},
        Case{"suffix:12", DraftSpec::Kind::kSuffix, 12},
        Case{"recycle", DraftSpec::Kind::kRecycle, 0},
        Case{"recycle:4", DraftSpec::Kind::kRecycle, 4},
        Case{"self:20", DraftSpec::Kind::kSelf, 20},
        Case{"/models/draft.gguf", DraftSpec::Kind::kModel, 0}}) {
    auto d = ParseDraftSpec(c.text);
    ASSERT_TRUE(d.ok()) << c.text << ": " << d.status();
    EXPECT_EQ(d->kind, c.kind) << c.text;
    EXPECT_EQ(d->count, c.count) << c.text;
    EXPECT_EQ(d->text(), c.text);
    EXPECT_EQ(d->is_model(), c.kind == DraftSpec::Kind::kModel);
    EXPECT_EQ(d->is_lookup(), c.kind == DraftSpec::Kind::kNgram ||
                                  c.kind == DraftSpec::Kind::kSuffix ||
                                  c.kind == DraftSpec::Kind::kRecycle);
  }
  EXPECT_EQ(ParseDraftSpec("draft.gguf")->path, "draft.gguf");
  EXPECT_EQ(DraftSpec{}, *ParseDraftSpec("ngram"));  // the default
}

TEST(DraftSpecTest, BadCountsAndEmptyAreRefusedQuotingTheText) {
  for (const char* bad : {"", "ngram:", "ngram:0", "ngram:-2", "suffix:", "suffix:0", "recycle:0",
                          "recycle:x", "self:x", "self:3x", "self: 3"}) {
    auto d = ParseDraftSpec(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    if (*bad != '\0') {
      EXPECT_NE(d.status().message().find(bad), std::string_view::npos) << d.status();
    }
  }
}

}  // namespace
}  // namespace specnode

// The one table of error codes and the one request validator.
#include "coordinator/request_validator.h"

#include <optional>
#include <set>
#include <string>

#include "coordinator/request_error.h"
#include "gtest/gtest.h"

namespace specnode {
namespace {

TEST(RequestErrorTest, TableIsCompleteAndRoundTrips) {
  std::set<std::string> wires;
  size_t i = 0;
  for (const RequestErrorInfo& e : RequestErrorTable()) {
    EXPECT_EQ(static_cast<size_t>(e.code), i++) << e.wire;  // in enum order
    EXPECT_TRUE(wires.insert(e.wire).second) << "duplicate " << e.wire;
    RequestError parsed;
    ASSERT_TRUE(ParseWireCode(e.wire, &parsed));
    EXPECT_EQ(parsed, e.code);
    const absl::Status s = RequestErrorStatus(e.code, "why");
    EXPECT_EQ(s.code(), e.status) << e.wire;
    EXPECT_EQ(s.message(), "why");
    EXPECT_EQ(RequestErrorOf(s), e.code) << e.wire;
    EXPECT_GE(e.http, 400);
  }
  EXPECT_EQ(i, static_cast<size_t>(RequestError::kNotFound) + 1);  // the last code
  RequestError unused;
  EXPECT_FALSE(ParseWireCode("no_such_code", &unused));
}

// A status from below the request layer carries no code: it maps by its canonical code,
// never by its text.
TEST(RequestErrorTest, UntaggedStatusesMapByCanonicalCode) {
  EXPECT_EQ(RequestErrorOf(absl::ResourceExhaustedError("KV store full")),
            RequestError::kOverloaded);
  EXPECT_EQ(RequestErrorOf(absl::UnavailableError("rank 2 is gone")), RequestError::kUnavailable);
  EXPECT_EQ(RequestErrorOf(absl::DeadlineExceededError("rank 1 silent")),
            RequestError::kUnavailable);
  EXPECT_EQ(RequestErrorOf(absl::InvalidArgumentError("unknown SLA class")),
            RequestError::kInternal);  // the text is never read
  EXPECT_EQ(RequestErrorOf(absl::InvalidArgumentError("x"), RequestError::kBadRequest),
            RequestError::kBadRequest);
}

TEST(RequestValidatorTest, EachCheckHasItsCodeAndNamesTheField) {
  const RequestLimits limits{/*vocab_size=*/100, /*context_length=*/32, /*max_tokens=*/16};
  const std::vector<int32_t> prompt = {1, 2, 3};
  SamplingParams sp;
  EXPECT_TRUE(ValidateRequest(prompt, 8, sp, std::nullopt, limits).ok());
  EXPECT_TRUE(ValidateRequest(prompt, 8, sp, "code", limits).ok());
  struct Case {
    std::vector<int32_t> prompt;
    int64_t max_tokens;
    SamplingParams sp;
    std::optional<std::string> domain;
    RequestError code;
    const char* needle;
  };
  SamplingParams hot;
  hot.temperature = 101;
  SamplingParams topk;
  topk.top_k = -1;
  SamplingParams topp;
  topp.top_p = 1.5f;
  const Case cases[] = {
      {{}, 8, sp, std::nullopt, RequestError::kBadRequest, "prompt is empty"},
      {{1, 100}, 8, sp, std::nullopt, RequestError::kBadRequest, "token id 100"},
      {prompt, 0, sp, std::nullopt, RequestError::kBadRequest, "max_tokens"},
      {prompt, 17, sp, std::nullopt, RequestError::kBadRequest, "max_tokens must be in [1, 16]"},
      {prompt, 8, hot, std::nullopt, RequestError::kBadRequest, "temperature"},
      {prompt, 8, topk, std::nullopt, RequestError::kBadRequest, "top_k"},
      {prompt, 8, topp, std::nullopt, RequestError::kBadRequest, "top_p"},
      {prompt, 8, sp, "a b", RequestError::kBadRequest, "domain"},
      {prompt, 8, sp, std::string(), RequestError::kBadRequest, "domain"},
      {std::vector<int32_t>(20, 1), 13, sp, std::nullopt, RequestError::kPromptTooLong,
       "context length 32"},
  };
  for (const Case& c : cases) {
    const std::optional<std::string_view> domain =
        c.domain.has_value() ? std::optional<std::string_view>(*c.domain) : std::nullopt;
    const absl::Status s = ValidateRequest(c.prompt, c.max_tokens, c.sp, domain, limits);
    ASSERT_FALSE(s.ok()) << c.needle;
    EXPECT_EQ(RequestErrorOf(s), c.code) << s;
    EXPECT_NE(s.message().find(c.needle), std::string_view::npos) << s;
  }
}

}  // namespace
}  // namespace specnode

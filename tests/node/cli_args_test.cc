// The command-line parser: value, flag and list keys (a list key takes every following
// argument up to the next --option, as vLLM's --served-model-name A B), errors as statuses.
#include "node/cli/cli_args.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace specnode {
namespace {

absl::StatusOr<CliArgs> ParseArgs(std::vector<std::string> words) {
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return CliArgs::Parse(static_cast<int>(argv.size()), argv.data(), {"port", "model"},
                        {"check-config"}, {"served-model-name"});
}

TEST(CliArgsTest, AListKeyTakesEveryValueUpToTheNextOption) {
  auto a =
      ParseArgs({"serve", "--served-model-name", "a", "b", "--port", "8001", "--check-config"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->GetList("served-model-name"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(a->Get("port"), "8001");
  EXPECT_TRUE(a->Has("check-config"));
  EXPECT_TRUE(a->Has("served-model-name"));
  EXPECT_TRUE(a->GetList("model").empty());
}

TEST(CliArgsTest, AListKeyRepeatedOrInlineAppends) {
  auto a = ParseArgs(
      {"serve", "--served-model-name=a", "--model", "m.gguf", "--served-model-name", "b", "c"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->GetList("served-model-name"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(a->Get("model"), "m.gguf");
}

TEST(CliArgsTest, AListKeyWithoutAValueIsAnError) {
  for (const auto& words : std::vector<std::vector<std::string>>{
           {"serve", "--served-model-name"}, {"serve", "--served-model-name", "--port", "1"}}) {
    auto a = ParseArgs(words);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("--served-model-name needs a value"), std::string::npos)
        << a.status();
  }
}

TEST(CliArgsTest, ALaterValueWinsAndUnknownOptionsAreErrors) {
  auto a = ParseArgs({"serve", "--port", "1", "--port", "2"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->Get("port"), "2");
  EXPECT_FALSE(ParseArgs({"serve", "--host", "x"}).ok());
  EXPECT_FALSE(ParseArgs({"serve", "--check-config=yes"}).ok());
}

}  // namespace
}  // namespace specnode

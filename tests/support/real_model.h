// Test-only: the real model files the tests read (SmolLM2 from SPECNODE_MODEL, Gemma 3 270M
// from SPECNODE_GEMMA_MODEL; scripts/test sets both and SPECNODE_REQUIRE_MODEL=1).
//
//   SPECNODE_SKIP_WITHOUT_REAL_MODEL("SPECNODE_GEMMA_MODEL");  // in a TEST body
//   const Tokenizer* tok = testing_support::RealTokenizer("SPECNODE_GEMMA_MODEL");
//
// The macro skips the test when the variable is unset or names a missing file, and fails it
// instead under SPECNODE_REQUIRE_MODEL=1. RealTokenizer loads the file's tokenizer once per
// variable (nullptr, with a recorded failure, when the file does not load). Not
// thread-safe (gtest runs tests on one thread).
#pragma once

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "model/gguf/gguf_reader.h"
#include "model/tokenizer/tokenizer.h"

namespace specnode::testing_support {

// Why the file named by env_var cannot be used ("" when it can); *required says whether
// the run demands it (SPECNODE_REQUIRE_MODEL=1).
inline std::string RealModelMissing(const char* env_var, bool* required) {
  const char* req = std::getenv("SPECNODE_REQUIRE_MODEL");
  *required = req != nullptr && std::string(req) == "1";
  const char* path = std::getenv(env_var);
  if (path == nullptr || *path == '\0') {
    return std::string(env_var) + " is unset (scripts/fetch-model prints the path" +
           (*required ? "; SPECNODE_REQUIRE_MODEL=1)" : ")");
  }
  if (!std::filesystem::exists(path)) return std::string(env_var) + "=" + path + " does not exist";
  return "";
}

inline const Tokenizer* RealTokenizer(const char* env_var) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto it = loaded.find(env_var);
  if (it != loaded.end()) return it->second.get();
  std::unique_ptr<Tokenizer>& tok = loaded[env_var];
  const char* path = std::getenv(env_var);
  if (path == nullptr || !std::filesystem::exists(path)) return nullptr;
  auto file = GgufFile::Open(path);
  if (!file.ok()) {
    ADD_FAILURE() << env_var << "=" << path << ": " << file.status();
    return nullptr;
  }
  auto t = Tokenizer::FromGguf(**file);
  if (!t.ok()) {
    ADD_FAILURE() << "Tokenizer::FromGguf(" << path << "): " << t.status();
    return nullptr;
  }
  tok = std::move(*t);
  return tok.get();
}

// A ~10 KB prompt of `line` repeated: encodes to more than 2000 ids, decodes back to the
// text, and within 500 ms (typically a few ms; the bound leaves room for sanitizer builds).
inline void ExpectLongPromptEncodesQuickly(const Tokenizer& tok, const std::string& line) {
  std::string text;
  while (text.size() < 10000) text += line;
  const auto start = std::chrono::steady_clock::now();
  auto ids = tok.Encode(text, true);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_GT(ids->size(), 2000u);
  EXPECT_EQ(tok.Decode(*ids), text);
  ::testing::Test::RecordProperty("encode_ms", std::to_string(ms));
  EXPECT_LT(ms, 500.0) << ids->size() << " tokens";
}

}  // namespace specnode::testing_support

#define SPECNODE_SKIP_WITHOUT_REAL_MODEL(env_var)                           \
  do {                                                                      \
    bool required_ = false;                                                 \
    const std::string missing_ =                                            \
        ::specnode::testing_support::RealModelMissing(env_var, &required_); \
    if (!missing_.empty()) {                                                \
      if (required_) FAIL() << missing_;                                    \
      GTEST_SKIP() << missing_;                                             \
    }                                                                       \
  } while (0)

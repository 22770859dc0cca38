// Test-only helpers shared by the tokenizer tests (tokenizer_test.cc, tokenizer_spm_test.cc):
// a Tokenizer from a spec, and an encoding, each recording a gtest failure (and returning
// nullptr / no ids) instead of a Status.
#pragma once

#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "model/tokenizer/tokenizer.h"

namespace specnode::testing_support {

inline std::unique_ptr<Tokenizer> MustCreate(TokenizerSpec spec) {
  auto tok = Tokenizer::Create(std::move(spec));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

inline std::vector<int32_t> MustEncode(const Tokenizer& tok, std::string_view text, bool special) {
  auto ids = tok.Encode(text, special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

}  // namespace specnode::testing_support

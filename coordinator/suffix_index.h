// SuffixIndex: for every n-gram of a token stream (1 <= n <= max_n), the tokens that followed
// it, with how often and how recently — a suffix trie cut at depth max_n + 1, stored as a
// hash of the n-gram per node. It answers "after the longest suffix of this context seen
// before, which tokens came next, and in what share?", which is what frequency-ranked
// draft trees need (SuffixDecoding, Oliaro et al. 2024; SAM-Decoding matches the same
// suffixes with a suffix automaton, without the counts).
//
// A stream grows by Append; Break() ends a document (no n-gram spans a break), so one index
// holds many finished outputs of a domain. Deterministic: equal streams give equal answers.
//
// Memory: one entry per distinct (n-gram, next token) pair, at most max_n per token
// appended, and at most kMaxNext next tokens per n-gram (the rarest, then oldest, dropped).
// Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace specnode {

class SuffixIndex {
 public:
  // One continuation of an n-gram: `token` followed it `count` times, last at stream
  // position `last` (the position of `token` itself).
  struct Next {
    int32_t token = 0;
    int32_t count = 0;
    int64_t last = 0;
  };
  // The answer for a context: the longest n (0 = none) whose last-n-tokens n-gram has
  // continuations, and those continuations, most frequent first (ties: most recent first).
  struct Match {
    int n = 0;
    std::vector<Next> next;
    int64_t total = 0;  // sum of next[].count
  };
  static constexpr int kMaxNext = 16;

  // 1 <= max_n <= 64 (asserted: the drafter validates its options).
  explicit SuffixIndex(int max_n);

  int max_n() const { return max_n_; }
  // Tokens appended since construction or Clear (breaks not counted).
  int64_t size() const { return position_; }

  // Appends tokens to the current document, indexing every n-gram that ends before each.
  void Append(std::span<const int32_t> tokens);
  // Ends the current document: the next Append starts a new one.
  void Break();
  void Clear();

  // The longest n in [min_n, max_n] with continuations for the last n tokens of `tail`
  // (tail may be longer than max_n; only its last max_n tokens are read). n = 0 when none.
  Match Longest(std::span<const int32_t> tail, int min_n) const;

 private:
  static uint64_t Key(const int32_t* tokens, int n);
  void Record(uint64_t key, int32_t token);

  int max_n_;
  int64_t position_ = 0;
  std::vector<int32_t> window_;  // the current document's last max_n tokens
  std::unordered_map<uint64_t, std::vector<Next>> next_;
};

}  // namespace specnode

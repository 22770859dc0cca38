// Minimal command-line parsing for specnode subcommands: "--key value", "--key=value" and
// boolean "--flag". Each subcommand declares the keys it accepts; anything else is an
// InvalidArgument naming the key, so typos never pass silently.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace specnode {

class CliArgs {
 public:
  // value_keys take a value; flag_keys do not; list_keys take one or more values (every
  // following argument up to the next "--option", as vLLM's --served-model-name A B; a
  // repeated list key appends). argv[0] is the subcommand name.
  static absl::StatusOr<CliArgs> Parse(int argc, char** argv,
                                       const std::set<std::string>& value_keys,
                                       const std::set<std::string>& flag_keys,
                                       const std::set<std::string>& list_keys = {});

  bool Has(const std::string& key) const { return values_.count(key) > 0; }
  std::string Get(const std::string& key, const std::string& fallback = "") const;
  // InvalidArgument naming the key when the value is not a number in [lo, hi].
  absl::StatusOr<int64_t> GetInt(const std::string& key, int64_t fallback, int64_t lo,
                                 int64_t hi) const;
  absl::StatusOr<double> GetDouble(const std::string& key, double fallback, double lo,
                                   double hi) const;
  // A list key's values in command-line order (empty when absent).
  std::vector<std::string> GetList(const std::string& key) const;
  // Comma-separated integers ("1,2,3").
  absl::StatusOr<std::vector<int64_t>> GetIntList(const std::string& key) const;

 private:
  std::map<std::string, std::string> values_;  // a list key's: its last value
  std::map<std::string, std::vector<std::string>> lists_;
};

}  // namespace specnode

#include "node/cli/cli_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace specnode {

absl::StatusOr<CliArgs> CliArgs::Parse(int argc, char** argv,
                                       const std::set<std::string>& value_keys,
                                       const std::set<std::string>& flag_keys,
                                       const std::set<std::string>& list_keys) {
  CliArgs args;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string key = arg.substr(2);
    std::string value;
    bool has_inline = false;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
      has_inline = true;
    }
    if (flag_keys.count(key)) {
      if (has_inline) {
        return absl::InvalidArgumentError(absl::StrCat("--", key, " takes no value"));
      }
      args.values_[key] = "true";
    } else if (list_keys.count(key)) {
      std::vector<std::string>& list = args.lists_[key];
      const size_t before = list.size();
      if (has_inline) {
        list.push_back(value);
      } else {
        while (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0)
          list.push_back(argv[++i]);
      }
      if (list.size() == before) {
        return absl::InvalidArgumentError(absl::StrCat("--", key, " needs a value"));
      }
      args.values_[key] = list.back();
    } else if (value_keys.count(key)) {
      if (!has_inline) {
        if (i + 1 >= argc) {
          return absl::InvalidArgumentError(absl::StrCat("--", key, " needs a value"));
        }
        value = argv[++i];
      }
      args.values_[key] = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown option --", key));
    }
  }
  return args;
}

std::vector<std::string> CliArgs::GetList(const std::string& key) const {
  auto it = lists_.find(key);
  return it == lists_.end() ? std::vector<std::string>{} : it->second;
}

std::string CliArgs::Get(const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> CliArgs::GetInt(const std::string& key, int64_t fallback, int64_t lo,
                                        int64_t hi) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat("--", key, " must be an integer in [", lo, ", ",
                                                   hi, "], got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<double> CliArgs::GetDouble(const std::string& key, double fallback, double lo,
                                          double hi) const {
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  double v = 0;
  if (!absl::SimpleAtod(it->second, &v) || !std::isfinite(v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat("--", key, " must be a number in [", lo, ", ",
                                                   hi, "], got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<std::vector<int64_t>> CliArgs::GetIntList(const std::string& key) const {
  std::vector<int64_t> out;
  auto it = values_.find(key);
  if (it == values_.end()) return out;
  for (absl::string_view part : absl::StrSplit(it->second, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", key, ": '", part, "' is not an integer"));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace specnode

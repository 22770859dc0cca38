#include "node/session/router_config.h"

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specnode {
namespace {

using Json = nlohmann::json;

absl::Status Bad(const std::string& path, const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", where, ": ", what));
}

absl::Status CheckKeys(const std::string& path, const std::string& where, const Json& j,
                       const std::set<std::string>& allowed) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!allowed.count(it.key()) && it.key() != "description") {
      return Bad(path, where.empty() ? it.key() : where + "." + it.key(), "unknown key");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DomainRouter>> LoadRouterRules(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open router rules file ", path));
  std::stringstream text;
  text << in.rdbuf();
  const Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(path, "(top level)", "not valid JSON");
  if (!j.is_object()) return Bad(path, "(top level)", "expected an object");
  if (auto st = CheckKeys(path, "", j, {"default_domain", "max_scan_bytes", "rules"}); !st.ok()) {
    return st;
  }
  RouterConfig config;
  if (j.contains("default_domain")) {
    if (!j["default_domain"].is_string()) return Bad(path, "default_domain", "expected a string");
    config.default_domain = j["default_domain"].get<std::string>();
  }
  if (j.contains("max_scan_bytes")) {
    if (!j["max_scan_bytes"].is_number_unsigned()) {
      return Bad(path, "max_scan_bytes", "expected a positive integer");
    }
    config.max_scan_bytes = j["max_scan_bytes"].get<size_t>();
  }
  if (j.contains("rules")) {
    if (!j["rules"].is_array()) return Bad(path, "rules", "expected an array");
    for (size_t i = 0; i < j["rules"].size(); ++i) {
      const Json& r = j["rules"][i];
      const std::string where = absl::StrCat("rules[", i, "]");
      if (!r.is_object()) return Bad(path, where, "expected an object");
      if (auto st = CheckKeys(path, where, r, {"domain", "keywords", "regex", "regex_icase"});
          !st.ok()) {
        return st;
      }
      DomainRule rule;
      if (!r.contains("domain") || !r["domain"].is_string()) {
        return Bad(path, where + ".domain", "expected a string");
      }
      rule.domain = r["domain"].get<std::string>();
      if (r.contains("keywords")) {
        if (!r["keywords"].is_array()) return Bad(path, where + ".keywords", "expected an array");
        for (size_t k = 0; k < r["keywords"].size(); ++k) {
          if (!r["keywords"][k].is_string()) {
            return Bad(path, absl::StrCat(where, ".keywords[", k, "]"), "expected a string");
          }
          rule.keywords.push_back(r["keywords"][k].get<std::string>());
        }
      }
      if (r.contains("regex")) {
        if (!r["regex"].is_string()) return Bad(path, where + ".regex", "expected a string");
        rule.regex = r["regex"].get<std::string>();
      }
      if (r.contains("regex_icase")) {
        if (!r["regex_icase"].is_boolean()) {
          return Bad(path, where + ".regex_icase", "expected true or false");
        }
        rule.regex_icase = r["regex_icase"].get<bool>();
      }
      config.rules.push_back(std::move(rule));
    }
  }
  auto router = DomainRouter::Create(std::move(config));
  if (!router.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", router.status().message()));
  }
  return router;
}

}  // namespace specnode

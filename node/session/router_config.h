// Router rules from a JSON file (bench/prompts/router-rules.json is the example):
//   {"default_domain": "chat", "max_scan_bytes": 8192,
//    "rules": [{"domain": "code", "keywords": ["python", ...], "regex": "```",
//               "regex_icase": true}, ...]}
// Unknown keys are errors (a typo must not silently disable a rule); "description" is
// allowed anywhere for comments.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/domain_router.h"

namespace specnode {

// InvalidArgument naming the file and the JSON path of the problem (e.g.
// "rules.json: rules[2].keywords[0]: expected a string"); router construction errors
// (bad regex, bad domain name) come back with the file name prefixed.
absl::StatusOr<std::unique_ptr<DomainRouter>> LoadRouterRules(const std::string& path);

}  // namespace specnode

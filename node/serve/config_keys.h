// Every key of the serve config (docs/configs.md) beside the flag that sets the same field,
// or why it has none: the one mapping between YAML and the command line. The config reader
// takes its allowed keys from this table (cluster_config.cc ConfigKeysUnder), so a key
// exists exactly when it has a row; `specnode serve --print-flag-table` prints the table
// docs/configs.md quotes, and tests/serve/test_config.py checks that the docs quote it, that
// every flag is one `serve --help` documents, and that each flag sets what its key sets
// (`serve --print-config` prints every key's effective value).
// Immutable data; thread-safe.
#pragma once

#include <set>
#include <span>
#include <string>
#include <string_view>

namespace specnode {

struct ServeConfig;

struct ConfigKey {
  std::string_view key;   // dotted; "[]" marks a list's entries: "sla.classes[].name"
  std::string_view flag;  // "--max-active", or "" when only the YAML sets it
  std::string_view note;  // how the flag differs from the key, or why there is none
  // The field's value in a config, as `serve --print-config` prints it; null for a list's
  // entries.
  std::string (*value)(const ServeConfig&) = nullptr;
};

std::span<const ConfigKey> ConfigKeys();

// The names allowed directly under `prefix` ("" the top level, "serve", "sla.classes[]"),
// without a list's "[]": {"bind", "max_active", ...} for "serve".
std::set<std::string> ConfigKeysUnder(std::string_view prefix);

// "key: value" lines of every key with a value (`serve --print-config`: the effective
// config after the file and the flags).
std::string ConfigValues(const ServeConfig& config);

// The markdown table of ConfigKeys(): | YAML key | flag | note |.
std::string ConfigKeysMarkdown();

}  // namespace specnode

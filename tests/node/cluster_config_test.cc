// The serve config loader: the embedded default config states exactly the code's defaults
// (one source of truth: what `serve --help`, ServeConfig and local-cpu.yaml say agree),
// duplicate keys and a directory are refused naming the file.
#include "node/serve/cluster_config.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "node/serve/config_keys.h"

namespace specnode {
namespace {

TEST(ServeConfigTest, EmbeddedConfigStatesTheDefaults) {
  auto embedded = ParseServeConfig(kEmbeddedLocalCpuConfig, "local-cpu.yaml");
  ASSERT_TRUE(embedded.ok()) << embedded.status();
  auto defaults = ParseServeConfig("", "(empty)");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  const ServeConfig& e = *embedded;
  const ServeConfig& d = *defaults;
  EXPECT_EQ(e.model, d.model);
  EXPECT_EQ(e.threads, d.threads);
  EXPECT_EQ(e.device, d.device);
  EXPECT_EQ(e.bind, d.bind);
  EXPECT_EQ(e.max_active, d.max_active);
  EXPECT_EQ(e.max_queue, d.max_queue);
  EXPECT_EQ(e.drain_timeout_s, d.drain_timeout_s);
  EXPECT_EQ(e.limits.max_tokens, d.limits.max_tokens);
  EXPECT_EQ(e.limits.max_frame_bytes, d.limits.max_frame_bytes);
  EXPECT_EQ(e.metrics_bind, d.metrics_bind);
  // The OpenAI API on by default, on vLLM's port, loopback only (docs/openai-api.md).
  ASSERT_TRUE(e.http_bind.has_value() && d.http_bind.has_value());
  EXPECT_EQ(e.http_bind->text(), d.http_bind->text());
  EXPECT_EQ(d.http_bind->text(), "127.0.0.1:8000");
  EXPECT_EQ(e.served_model_names, d.served_model_names);
  EXPECT_EQ(e.max_model_len, d.max_model_len);
  EXPECT_EQ(e.draft, d.draft);
  EXPECT_EQ(e.k_max, d.k_max);
  EXPECT_EQ(e.free_threshold, d.free_threshold);
  EXPECT_EQ(e.disable_threshold, d.disable_threshold);
  EXPECT_EQ(e.probe_every, d.probe_every);
  EXPECT_EQ(e.acceptance, d.acceptance);
  EXPECT_EQ(d.acceptance, AcceptanceRule::kMatch);
  EXPECT_EQ(e.default_domain, d.default_domain);
  // The KV section, field by field (the defaults the docs state: docs/kvstore.md).
  EXPECT_EQ(e.kv.mode, d.kv.mode);
  EXPECT_EQ(e.kv.capacity_bytes, d.kv.capacity_bytes);
  EXPECT_EQ(e.kv.memory_utilization, d.kv.memory_utilization);
  EXPECT_EQ(e.kv.host_capacity_bytes, d.kv.host_capacity_bytes);
  EXPECT_EQ(e.kv.page_tokens, d.kv.page_tokens);
  EXPECT_EQ(e.kv.sink_tokens, d.kv.sink_tokens);
  EXPECT_EQ(e.kv.window_tokens, d.kv.window_tokens);
  EXPECT_EQ(e.kv.critical_threshold, d.kv.critical_threshold);
  EXPECT_EQ(e.kv.mass_sample_every, d.kv.mass_sample_every);
  EXPECT_EQ(e.kv.demote_every, d.kv.demote_every);
  EXPECT_EQ(e.kv.evict, d.kv.evict);
  EXPECT_EQ(e.kv.rotate, d.kv.rotate);
  EXPECT_EQ(d.kv.page_tokens, KvOptions{}.page_tokens);
  EXPECT_EQ(d.kv.critical_threshold, KvOptions{}.critical_threshold);
  EXPECT_EQ(e.sla.default_class, d.sla.default_class);
  EXPECT_EQ(e.sla.window_fraction, d.sla.window_fraction);
  ASSERT_EQ(e.sla.classes.size(), d.sla.classes.size());
  for (size_t i = 0; i < e.sla.classes.size(); ++i) {
    EXPECT_EQ(e.sla.classes[i].name, d.sla.classes[i].name);
    EXPECT_EQ(e.sla.classes[i].ttft_p99_ms, d.sla.classes[i].ttft_p99_ms);
    EXPECT_EQ(e.sla.classes[i].tpot_p99_ms, d.sla.classes[i].tpot_p99_ms);
    EXPECT_EQ(e.sla.classes[i].priority, d.sla.classes[i].priority);
  }
}

TEST(ServeConfigTest, ServedModelNamesAreANameOrAList) {
  auto one = ParseServeConfig("serve:\n  served_model_name: smol\n", "n.yaml");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->served_model_names, std::vector<std::string>{"smol"});
  auto two = ParseServeConfig("serve:\n  served_model_name: [smol, gpt-4o-mini]\n", "n.yaml");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->served_model_names, (std::vector<std::string>{"smol", "gpt-4o-mini"}));
  // The older key still reads; both at once is an error naming it.
  auto legacy = ParseServeConfig("serve:\n  model_name: old\n", "n.yaml");
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_EQ(legacy->served_model_names, std::vector<std::string>{"old"});
  auto both = ParseServeConfig("serve:\n  served_model_name: a\n  model_name: b\n", "n.yaml");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("n.yaml:3: serve.model_name: is the older name"),
            std::string_view::npos)
      << both.status();
  for (const char* bad : {"[a, a]", "\"a b\"", "\"\"", "[a, {x: 1}]", "{x: 1}"}) {
    auto c = ParseServeConfig(absl::StrCat("serve:\n  served_model_name: ", bad, "\n"), "n.yaml");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find("n.yaml:2: serve.served_model_name"),
              std::string_view::npos)
        << c.status();
  }
  EXPECT_TRUE(CheckServedModelNames({"a", "b/c:1"}).ok());
  EXPECT_FALSE(CheckServedModelNames({"tab\there"}).ok());
  EXPECT_FALSE(CheckServedModelNames({std::string(257, 'x')}).ok());
}

TEST(ServeConfigTest, MaxModelLenAndHttpBindAreRead) {
  auto c = ParseServeConfig("serve:\n  max_model_len: 2048\n  http_bind: 0.0.0.0:8080\n", "m.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_model_len, 2048);
  ASSERT_TRUE(c->http_bind.has_value());
  EXPECT_EQ(c->http_bind->text(), "0.0.0.0:8080");
  for (const char* off : {"off", "\"\""}) {
    auto o = ParseServeConfig(absl::StrCat("serve:\n  http_bind: ", off, "\n"), "m.yaml");
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_FALSE(o->http_bind.has_value()) << off;
  }
  auto neg = ParseServeConfig("serve:\n  max_model_len: -1\n", "m.yaml");
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("m.yaml:2: serve.max_model_len"), std::string_view::npos)
      << neg.status();
  auto bad =
      ParseServeConfig("serve:\n  bind: tcp://127.0.0.1:1\n  http_bind: nowhere\n", "m.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("m.yaml:3: serve.http_bind"), std::string_view::npos)
      << bad.status();
}

TEST(ServeConfigTest, DuplicateKeysAreErrorsWithTheirLine) {
  auto c = ParseServeConfig("kv:\n  window_tokens: 32\n  page_tokens: 8\n  window_tokens: 16\n",
                            "dup.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("dup.yaml:4: kv.window_tokens: duplicate key"),
            std::string_view::npos)
      << c.status();
  auto top = ParseServeConfig("serve:\n  max_active: 2\nserve:\n  max_queue: 3\n", "dup.yaml");
  ASSERT_FALSE(top.ok());
  EXPECT_NE(top.status().message().find("dup.yaml:3: serve: duplicate key"), std::string_view::npos)
      << top.status();
}

TEST(ServeConfigTest, TreeChoiceIsReadWithItsLine) {
  auto d = ParseServeConfig("speculation:\n  tree_nodes: 8\n", "t.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->trees_always);  // measured by default
  auto always =
      ParseServeConfig("speculation:\n  tree_nodes: 8\n  tree_choice: always\n", "t.yaml");
  ASSERT_TRUE(always.ok()) << always.status();
  EXPECT_TRUE(always->trees_always);
  auto bad = ParseServeConfig("speculation:\n  tree_nodes: 8\n  tree_choice: often\n", "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(
                "t.yaml:3: speculation.tree_choice: expected measured or always, got \"often\""),
            std::string_view::npos)
      << bad.status();
}

TEST(ServeConfigTest, AcceptanceRuleIsReadWithItsLine) {
  auto ratio = ParseServeConfig("speculation:\n  acceptance: ratio\n", "a.yaml");
  ASSERT_TRUE(ratio.ok()) << ratio.status();
  EXPECT_EQ(ratio->acceptance, AcceptanceRule::kRatio);
  auto bad = ParseServeConfig("speculation:\n  draft: ngram\n  acceptance: maybe\n", "a.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("a.yaml:3: speculation.acceptance: acceptance rule must "
                                        "be match or ratio"),
            std::string_view::npos)
      << bad.status();
}

TEST(ServeConfigTest, ChatTemplateIsABuiltInName) {
  auto gemma = ParseServeConfig("model:\n  chat_template: gemma\n", "t.yaml");
  ASSERT_TRUE(gemma.ok()) << gemma.status();
  EXPECT_NE(gemma->chat_template.find("<start_of_turn>"), std::string::npos);
  EXPECT_TRUE(ParseServeConfig("", "t.yaml")->chat_template.empty());  // the file's own
  auto bad = ParseServeConfig("model:\n  threads: 2\n  chat_template: alpaca\n", "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(
      bad.status().message().find("t.yaml:3: model.chat_template: unknown chat template "
                                  "\"alpaca\" (built in: chatml, llama3, zephyr, gemma, mistral, "
                                  "llama2)"),
      std::string_view::npos)
      << bad.status();
}

TEST(ServeConfigTest, ADirectoryIsNotAConfig) {
  const std::string dir = ::testing::TempDir();
  auto c = LoadServeConfig(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("is a directory"), std::string_view::npos) << c.status();
  auto missing = LoadServeConfig(dir + "/no-such-config.yaml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// The reader takes its keys from the flag table (config_keys.h): each section's names
// come from the rows, every row is one key, and a key without a row is unknown.
TEST(ServeConfigTest, TheKeysAreTheFlagTablesRows) {
  EXPECT_EQ(ConfigKeysUnder(""), (std::set<std::string>{"version", "model", "serve", "speculation",
                                                        "router", "kv", "sla", "topology"}));
  EXPECT_EQ(ConfigKeysUnder("topology.groups[]"),
            (std::set<std::string>{"name", "draft", "target"}));
  EXPECT_EQ(ConfigKeysUnder("topology.groups[].target[]"),
            (std::set<std::string>{"rank", "device", "host"}));
  EXPECT_TRUE(ConfigKeysUnder("serve").count("http_threads"));
  std::set<std::string> keys;
  for (const ConfigKey& k : ConfigKeys()) {
    EXPECT_TRUE(keys.insert(std::string(k.key)).second) << k.key;
    EXPECT_TRUE(k.flag.empty() || k.flag.starts_with("--")) << k.key;
    EXPECT_TRUE(!k.flag.empty() || !k.note.empty()) << k.key << ": no flag says why";
  }
  absl::StatusOr<ServeConfig> c = ParseServeConfig("serve:\n  http_thread: 3\n", "t.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "t.yaml:2: serve.http_thread: unknown key");
  EXPECT_TRUE(ParseServeConfig("serve:\n  http_threads: 3\n", "t.yaml").ok());
  // Every value the table prints reads back from a parsed config.
  c = ParseServeConfig("kv:\n  page_tokens: 16\n", "t.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_NE(ConfigValues(*c).find("kv.page_tokens: 16\n"), std::string::npos);
}

}  // namespace
}  // namespace specnode

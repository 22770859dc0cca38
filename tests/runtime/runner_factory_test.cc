// The runtime layer: the typed Device, the one runner factory on the CPU (the runner it
// builds computes what the reference pass computes, and answers KV management through its
// cache), its refusals (a device that cannot do what was asked says so, naming the device,
// before anything is loaded — these run everywhere), and, on a GPU (skipped without one,
// saying why), the speculative engine driving a GPU runner.
#include "runtime/runner_factory.h"

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "coordinator/ngram_drafter.h"
#include "coordinator/spec_engine.h"
#include "coordinator/suffix_drafter.h"
#include "gtest/gtest.h"
#include "kvstore/kv_cache_factory.h"
#include "model/cpu/thread_pool.h"
#include "model/llama/cpu_forward.h"
#include "model/llama/dense_kv_cache.h"
#include "model/llama/device.h"
#include "model/llama/llama_model.h"
#include "model/llama/tiny_model.h"
#include "runtime/host_memory.h"
#include "tests/support/temp_file.h"

namespace specnode {
namespace {

// `arch`: a row of the architecture table, or "llama_window" (llama with a window of 8).
std::string TinyModel(const std::string& tag, const std::string& arch = "llama") {
  TinyModelOptions o;
  o.n_layers = 2;
  o.weight_type = GgmlType::kQ4_1;
  o.arch = arch == "llama_window" ? "llama" : arch;
  if (arch == "llama_window" || arch == "gemma3") o.sliding_window = 8;
  if (arch == "qwen3" || arch == "gemma3") o.head_dim = 32;
  const std::string path = testing_support::TempFilePath("runtime_" + tag);
  EXPECT_TRUE(WriteTinyModel(o, path).ok());
  return path;
}

std::vector<int32_t> Tokens(int n, int offset) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + offset) % 250 + 3;
  return t;
}

TEST(DeviceTest, ParsesCpuAndCudaOnly) {
  auto cpu = ParseDevice("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_TRUE(cpu->is_cpu());
  EXPECT_EQ(cpu->name(), "cpu");
  auto cuda = ParseDevice("cuda:12");
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(*cuda, Device::Cuda(12));
  EXPECT_EQ(cuda->name(), "cuda:12");
  for (const char* bad : {"", "gpu", "cuda", "cuda:", "cuda:-1", "cuda:1x", " cuda:0", "CPU"}) {
    auto d = ParseDevice(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("expected cpu or cuda:N"), std::string_view::npos);
  }
}

// The factory's CPU runner computes the reference pass's logits bit for bit, and its
// KV management (room, memory, tokens per class, swap) comes from its store.
TEST(RunnerFactoryTest, CpuRunnerEqualsTheReferencePassAndManagesItsStore) {
  auto model = LlamaModel::Load(TinyModel("cpu"));
  ASSERT_TRUE(model.ok()) << model.status();
  const LlamaModel& m = **model;
  ThreadPool pool(2);
  RunnerOptions o;
  o.kv.mode = KvMode::kFull;
  o.pool = &pool;
  auto runner = MakeRunner(m.config(), m.weights(), o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->device(), "cpu");
  CpuLlamaForward ref(m.config(), m.weights(), &pool);
  auto cache = MakeKvCache(m.config(), m.weights().kv_heads_held(), o.kv);
  ASSERT_TRUE(cache.ok());
  const auto prompt = Tokens(9, 1);
  std::vector<BatchEntry> batch = {{1, prompt, true}};
  std::vector<float> got, want;
  ASSERT_TRUE((*runner)->Forward(batch, &got).ok());
  ASSERT_TRUE(ref.Forward(batch, cache->get(), &want).ok());
  EXPECT_EQ(got, want);
  const auto room = (*runner)->Room(16);
  ASSERT_TRUE(room.has_value());
  EXPECT_GT(room->needed, 0);
  EXPECT_GT(room->available, room->needed);
  const auto mem = (*runner)->Memory();
  ASSERT_TRUE(mem.has_value());
  ASSERT_TRUE(mem->class_tokens.has_value());
  EXPECT_EQ((*mem->class_tokens)[0], 9);
  EXPECT_EQ(mem->used_bytes, mem->class_bytes[0]);
  EXPECT_EQ((*runner)->SequenceTokens(1).value()[0], 9);
  ASSERT_TRUE((*runner)->SwapOut(1).ok());
  EXPECT_GT((*runner)->Memory()->host_bytes.value_or(0), 0);
  ASSERT_TRUE((*runner)->SwapIn(1).ok());
  EXPECT_EQ((*runner)->Length(1), 9);
}

// The dense reference cache keeps no accounts: the runner says it does not know, and
// refuses swapping and forks by name.
TEST(RunnerFactoryTest, DenseCacheAnswersNoManagement) {
  auto model = LlamaModel::Load(TinyModel("dense"));
  ASSERT_TRUE(model.ok()) << model.status();
  RunnerOptions o;
  o.kv.mode = KvMode::kDense;
  auto runner = MakeRunner((*model)->config(), (*model)->weights(), o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const auto prompt = Tokens(4, 2);
  std::vector<float> logits;
  ASSERT_TRUE((*runner)->Forward({{{1, prompt, false}}}, &logits).ok());
  EXPECT_FALSE((*runner)->Room(1).has_value());
  EXPECT_FALSE((*runner)->Memory().has_value());
  EXPECT_FALSE((*runner)->SequenceTokens(1).has_value());
  EXPECT_EQ((*runner)->SwapOut(1).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ((*runner)->Fork(1, 2).code(), absl::StatusCode::kUnimplemented);
}

// kv.memory_utilization sizes the store from the device's memory with the model loaded
// (the host's on the CPU): a fraction that leaves room gives a capacity within what the
// host has, one that leaves none is refused naming the flags (and builds nothing).
TEST(RunnerFactoryTest, MemoryUtilizationSizesTheStoreFromTheDevice) {
  auto model = LlamaModel::Load(TinyModel("budget"));
  ASSERT_TRUE(model.ok()) << model.status();
  auto host = HostMemory();
  ASSERT_TRUE(host.ok()) << host.status();
  RunnerOptions o;
  o.kv.mode = KvMode::kFull;
  o.kv.memory_utilization = 1.0;
  auto runner = MakeRunner((*model)->config(), (*model)->weights(), o);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const auto mem = (*runner)->Memory();
  ASSERT_TRUE(mem.has_value());
  EXPECT_NE(mem->capacity_bytes, o.kv.capacity_bytes);
  EXPECT_GT(mem->capacity_bytes, 0);
  EXPECT_LE(mem->capacity_bytes, host->total_bytes);
  EXPECT_EQ(mem->capacity_bytes % (int64_t{1} << 20), 0);
  o.kv.memory_utilization = 1e-9;  // under a byte of the host
  auto none = MakeRunner((*model)->config(), (*model)->weights(), o);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("--gpu-memory-utilization"), std::string_view::npos)
      << none.status();
  o.kv.memory_utilization = 1.5;
  EXPECT_EQ(CheckRunnerOptions(o).code(), absl::StatusCode::kInvalidArgument);
}

TEST(RunnerFactoryTest, BadKvOptionsAreRefusedNamingTheField) {
  RunnerOptions o;
  o.kv.window_tokens = 0;
  absl::Status s = CheckRunnerOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("window_tokens"), std::string_view::npos) << s;
  o.kv.window_tokens = 64;
  o.kv.evict = true;
  o.kv.evict_window = 8;
  s = CheckRunnerOptions(o);
  EXPECT_NE(s.message().find("evict_window"), std::string_view::npos) << s;
}

// What a GPU cannot do is refused with the device's name, before any device is touched
// (so these answer the same with or without a GPU); a build without the CUDA backend
// refuses every cuda:N as Unimplemented. Every KV mode of the store (full, int8, int4,
// mixed, rotation, eviction) is available on a GPU's page pool, as on the CPU.
TEST(RunnerFactoryTest, GpuRefusalsNameTheDevice) {
  RunnerOptions o;
  o.device = Device::Cuda(0);
  if (!HaveCudaBackend()) {
    const absl::Status s = CheckRunnerOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_NE(s.message().find("cuda:0"), std::string_view::npos) << s;
    return;
  }
  struct Case {
    const char* what;
    KvMode mode;
    std::optional<ActQuant> act;
    const char* needle;
  };
  const Case cases[] = {
      {"dense", KvMode::kDense, {}, "dense is the CPU's f32 reference cache"},
      {"activations", KvMode::kAuto, ActQuant::kInt8, "int16 blocks"},
  };
  for (const Case& c : cases) {
    o.kv = KvOptions{};
    o.kv.mode = c.mode;
    o.activations = c.act;
    const absl::Status s = CheckRunnerOptions(o, nullptr, /*probe_device=*/false);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_NE(s.message().find(c.needle), std::string_view::npos) << c.what << ": " << s;
  }
  // What it can do passes the static checks (int16 activations are what it runs); then the
  // device itself must be there.
  o.activations = ActQuant::kInt16;
  LlamaConfig config;
  config.head_dim = 64;
  for (KvMode mode : {KvMode::kAuto, KvMode::kFull, KvMode::kInt8, KvMode::kInt4, KvMode::kMixed}) {
    o.kv = KvOptions{};
    o.kv.mode = mode;
    const absl::Status s = CheckRunnerOptions(o, &config, /*probe_device=*/false);
    EXPECT_TRUE(s.ok()) << KvModeName(mode) << ": " << s;
  }
  o.kv = KvOptions{};
  o.kv.rotate = true;
  o.kv.evict = true;
  o.kv.evict_window = 256;
  EXPECT_TRUE(CheckRunnerOptions(o, &config, /*probe_device=*/false).ok());
  // Rotation needs a power-of-two head_dim, as on the CPU.
  LlamaConfig odd;
  odd.head_dim = 80;
  const absl::Status rot = CheckRunnerOptions(o, &odd, /*probe_device=*/false);
  EXPECT_NE(rot.message().find("unrotated"), std::string_view::npos) << rot;
  o.kv = KvOptions{};
  LlamaConfig wide;
  wide.head_dim = 512;
  const absl::Status s = CheckRunnerOptions(o, &wide, /*probe_device=*/false);
  EXPECT_NE(s.message().find("head_dim 512"), std::string_view::npos) << s;
  // Every row of the architecture table, and sliding windows, pass the GPU's table
  // (CudaBackend::Caps; what it lacks is refused there, model/llama/backend_caps.h).
  for (const char* arch : {"llama", "qwen2", "qwen3", "gemma3"}) {
    LlamaConfig other = config;
    other.architecture = arch;
    other.arch = *FindArch(arch);
    other.sliding_window = std::string_view(arch) == "gemma3" ? 512 : 0;
    const absl::Status a = CheckRunnerOptions(o, &other, /*probe_device=*/false);
    EXPECT_TRUE(a.ok()) << arch << ": " << a;
  }
  LlamaConfig windowed = config;
  windowed.sliding_window = 4096;
  EXPECT_TRUE(CheckRunnerOptions(o, &windowed, /*probe_device=*/false).ok());
}

// Returns why no GPU runner can be made here ("" when one can).
std::string NoGpuReason() {
  RunnerOptions o;
  o.device = Device::Cuda(0);
  const absl::Status s = CheckRunnerOptions(o);
  return s.ok() ? "" : std::string(s.message());
}

// The speculative engine on a GPU target with the n-gram drafter gives exactly the greedy
// tokens of the GPU target alone, in every KV mode (mixed with a small window, so tokens are
// demoted during the run); the runner's KV memory is in the mode's classes.
// Every architecture (and a windowed llama) in every KV mode: the runner the factory makes
// on a GPU decodes the same greedy tokens with speculation as without.
class GpuRunnerTest : public ::testing::TestWithParam<std::tuple<std::string, KvMode>> {};

TEST_P(GpuRunnerTest, SpeculativeGreedyEqualsTargetOnly) {
  if (const std::string why = NoGpuReason(); !why.empty()) GTEST_SKIP() << why;
  const auto& [arch, mode] = GetParam();
  auto model = LlamaModel::Load(TinyModel("gpu_" + arch, arch));
  ASSERT_TRUE(model.ok()) << model.status();
  // Draft: 0 none, 1 prompt lookup chains, 2 suffix-drafter trees (verified with the tree
  // mask and KeepRows on the GPU pool's per-row key lists).
  auto generate = [&](int draft) {
    const bool speculate = draft > 0;
    RunnerOptions o;
    o.device = Device::Cuda(0);
    o.kv.mode = mode;
    o.kv.window_tokens = 8;
    o.kv.sink_tokens = 2;
    o.kv.demote_every = 4;
    auto runner = MakeRunner((*model)->config(), (*model)->weights(), o);
    EXPECT_TRUE(runner.ok()) << runner.status();
    if (!runner.ok()) return std::vector<int32_t>{};
    std::unique_ptr<Drafter> drafter;
    std::unique_ptr<SpecController> controller;
    std::vector<DraftGroup> groups;
    if (draft == 1) drafter = std::move(NgramDrafter::Create({})).value();
    if (draft == 2) {
      SuffixDrafterOptions so;
      so.min_n = 1;
      so.min_share = 0.0;
      drafter = std::move(SuffixDrafter::Create(so)).value();
    }
    if (speculate) {
      controller = std::move(SpecController::Create({})).value();
      groups.push_back({drafter.get(), controller.get()});
    }
    SpecEngineOptions eo;
    eo.adaptive = false;
    eo.fixed_k = 4;
    eo.tree_nodes = draft == 2 ? 8 : 0;
    if (draft == 2) {
      EXPECT_TRUE((*runner)->TreePasses());
    }
    SpeculativeEngine engine(runner->get(), groups, eo);
    // A repetitive prompt, so the n-gram drafter proposes something.
    SpecRequest r;
    r.id = 1;
    for (int rep = 0; rep < 4; ++rep) {
      for (int32_t t : Tokens(6, 11)) r.prompt.push_back(t);
    }
    r.max_new_tokens = 24;
    r.ignore_stop = true;
    EXPECT_TRUE(engine.Start(r).ok());
    std::vector<int32_t> out;
    std::vector<SeqStepResult> results;
    for (int guard = 0; guard < 1000; ++guard) {
      const absl::Status st = engine.Step(std::vector<SeqId>{1}, &results);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) break;
      out.insert(out.end(), results[0].tokens.begin(), results[0].tokens.end());
      if (results[0].finish != FinishReason::kNone) break;
    }
    const auto mem = (*runner)->Memory();
    EXPECT_TRUE(mem.has_value());
    if (mem.has_value()) {
      const auto& b = mem->class_bytes;
      EXPECT_EQ(mem->used_bytes, b[0] + b[1] + b[2]);
      if (mode == KvMode::kFull) {
        EXPECT_EQ(b[1] + b[2], 0);
      } else if (mode == KvMode::kInt8) {
        EXPECT_EQ(b[0] + b[2], 0);
      } else if (mode == KvMode::kInt4) {
        EXPECT_EQ(b[0] + b[1], 0);
      }
      if (mode == KvMode::kMixed || mode == KvMode::kAuto) {
        EXPECT_GT(b[0], 0);
        EXPECT_GT(b[1] + b[2], 0) << "nothing was demoted";
      }
    }
    return out;
  };
  const std::vector<int32_t> direct = generate(0);
  EXPECT_EQ(direct.size(), 24u);
  EXPECT_EQ(generate(1), direct);
  EXPECT_EQ(generate(2), direct) << "draft trees";
}

INSTANTIATE_TEST_SUITE_P(
    KvModes, GpuRunnerTest,
    ::testing::Combine(::testing::Values(std::string("llama"), std::string("qwen2"),
                                         std::string("qwen3"), std::string("gemma3"),
                                         std::string("llama_window")),
                       ::testing::Values(KvMode::kAuto, KvMode::kFull, KvMode::kInt8, KvMode::kInt4,
                                         KvMode::kMixed)),
    [](const auto& info) {
      return std::get<0>(info.param) + "_" + std::string(KvModeName(std::get<1>(info.param)));
    });

}  // namespace
}  // namespace specnode

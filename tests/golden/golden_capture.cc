// golden_capture: records what the CPU forward pass computes on the real model, bit for
// bit, so that a refactoring of the graph, the backend seam or the KV store can be checked
// to change nothing (tests/golden/README.md).
//
//   golden_capture --model M.gguf --write DIR   writes DIR/<kernels>.json
//   golden_capture --model M.gguf --check DIR   compares with DIR/<kernels>.json
//   [--expect-kernels K]  skip (exit 77) unless the kernels in use are K
//   [--long-text FILE]    the long prompt's text (default tests/data/kv-eval/01-...)
//
// <kernels> is the CPU kernel family in use (CpuKernelName(): scalar, avx2, avx512,
// avx512-vnni; SPECNODE_CPU caps it, so one machine can capture and check every level it
// has). --check exits 77 (ctest's skip code) when the kernels are not --expect-kernels or
// no golden file exists for them, 1 on any difference, naming the first case and pass that
// differ.
//
// Cases (every one in both activation roundings, int16 and int8):
//   <act>/<kv>/single/<prompt>   prefill then greedy decode, one sequence, per KV mode
//   <act>/<kv>/batch             three prompts prefilled in one pass, then decoded together
//   <act>/<kv>/verify            a K+1 verification pass (all rows' logits), a rollback, a
//                                pass of rejected drafts, greedy decode after it
//   <act>/tp3-<kv>/...           the same through three tensor-parallel shards (threads
//                                over a LocalCommunicatorGroup), rank 0's logits
// Each pass's logits are hashed (FNV-1a over their f32 bytes) and the greedy tokens kept;
// the top-3 logits of each case's last pass are stored as decimals to show how far a
// mismatch is.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "model/cpu/cpu_features.h"
#include "model/status_macros.h"
#include "model/tokenizer/chat_template.h"
#include "tests/golden/golden_engine.h"

namespace specnode {
namespace {

using json = nlohmann::json;

constexpr int kSkip = 77;

uint64_t Fnv1a(const std::vector<float>& v) {
  uint64_t h = 0xcbf29ce484222325ULL;
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

int32_t Argmax(const float* row, int32_t vocab) {
  int32_t best = 0;
  for (int32_t i = 1; i < vocab; ++i) {
    if (row[i] > row[best]) best = i;
  }
  return best;
}

// One case's record: hashes of every pass, greedy tokens, top-3 of the last pass.
struct Recorder {
  int32_t vocab = 0;
  json hashes = json::array();
  json tokens = json::array();
  std::vector<float> last;

  void Pass(const std::vector<float>& logits) {
    hashes.push_back(absl::StrFormat("%016x", Fnv1a(logits)));
    last = logits;
  }
  json Done() const {
    json top = json::array();
    if (!last.empty()) {
      std::vector<int32_t> ids(vocab);
      for (int32_t i = 0; i < vocab; ++i) ids[i] = i;
      const float* row = last.data() + last.size() - vocab;
      std::partial_sort(ids.begin(), ids.begin() + 3, ids.end(),
                        [row](int32_t a, int32_t b) { return row[a] > row[b]; });
      for (int i = 0; i < 3; ++i) {
        top.push_back({ids[i], absl::StrFormat("%.9g", row[ids[i]])});
      }
    }
    return {{"hashes", hashes}, {"tokens", tokens}, {"top", top}};
  }
};

struct Prompt {
  std::string name;
  std::vector<int32_t> ids;
};

absl::StatusOr<std::vector<Prompt>> Prompts(const GoldenModel& model,
                                            const std::string& long_text) {
  const Tokenizer& tok = model.tokenizer();
  std::vector<Prompt> out;
  auto chat = [&](const std::string& name, const std::string& text) -> absl::Status {
    SPECNODE_ASSIGN_OR_RETURN(std::string rendered,
                              ApplyChatTemplate(tok.spec().chat_template, {{"user", text}}, true));
    SPECNODE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.Encode(rendered, true));
    out.push_back({name, std::move(ids)});
    return absl::OkStatus();
  };
  SPECNODE_RETURN_IF_ERROR(chat("capital", "What is the capital of France?"));
  SPECNODE_RETURN_IF_ERROR(chat("haiku", "Write a haiku about GPUs."));
  SPECNODE_ASSIGN_OR_RETURN(std::vector<int32_t> code,
                            tok.Encode("def fibonacci(n):\n    \"\"\"Return the n-th", false));
  out.push_back({"code", std::move(code)});
  // Long enough that mixed mode demotes tokens (window 64) and pages fill.
  SPECNODE_ASSIGN_OR_RETURN(std::vector<int32_t> lng, tok.Encode(long_text, false));
  if (lng.size() > 200) lng.resize(200);
  out.push_back({"long", std::move(lng)});
  return out;
}

// Prefill (one pass) then greedy decode of `n_decode` tokens.
absl::StatusOr<json> Single(GoldenEngine& e, const Prompt& p, int n_decode) {
  Recorder r;
  r.vocab = e.vocab();
  std::vector<float> logits;
  const SeqId seq = 1;
  BatchEntry entry{seq, p.ids, false};
  SPECNODE_RETURN_IF_ERROR(e.Forward({&entry, 1}, &logits));
  r.Pass(logits);
  for (int i = 0; i < n_decode; ++i) {
    const int32_t t = Argmax(logits.data(), e.vocab());
    r.tokens.push_back(t);
    BatchEntry d{seq, {&t, 1}, false};
    SPECNODE_RETURN_IF_ERROR(e.Forward({&d, 1}, &logits));
    r.Pass(logits);
  }
  e.Free(seq);
  return r.Done();
}

// Three prompts prefilled in one pass, then decoded together.
absl::StatusOr<json> Batch(GoldenEngine& e, const std::vector<Prompt>& prompts, int n_decode) {
  Recorder r;
  r.vocab = e.vocab();
  std::vector<float> logits;
  std::vector<BatchEntry> batch;
  for (int i = 0; i < 3; ++i) batch.push_back({10 + i, prompts[i].ids, false});
  SPECNODE_RETURN_IF_ERROR(e.Forward(batch, &logits));
  r.Pass(logits);
  std::vector<int32_t> next(3);
  for (int step = 0; step < n_decode; ++step) {
    batch.clear();
    for (int i = 0; i < 3; ++i) {
      next[i] = Argmax(logits.data() + static_cast<size_t>(i) * e.vocab(), e.vocab());
      r.tokens.push_back(next[i]);
      batch.push_back({10 + i, {&next[i], 1}, false});
    }
    SPECNODE_RETURN_IF_ERROR(e.Forward(batch, &logits));
    r.Pass(logits);
  }
  for (int i = 0; i < 3; ++i) e.Free(10 + i);
  return r.Done();
}

// Verification: after the prompt, the last token plus K = 4 drafts (the greedy
// continuation) in one pass with every row's logits; then a rollback to keep two of them,
// a pass of four drafts that are wrong, a rollback of those, and greedy decode.
absl::StatusOr<json> Verify(GoldenEngine& e, const Prompt& p) {
  Recorder r;
  r.vocab = e.vocab();
  const int32_t vocab = e.vocab();
  std::vector<float> logits;
  const SeqId seq = 7;
  BatchEntry entry{seq, p.ids, false};
  SPECNODE_RETURN_IF_ERROR(e.Forward({&entry, 1}, &logits));
  r.Pass(logits);
  // Greedy drafts from a sequence of its own (decoded one token at a time).
  std::vector<int32_t> drafts;
  {
    const SeqId probe = 8;
    std::vector<float> pl = logits;
    BatchEntry pe{probe, p.ids, false};
    SPECNODE_RETURN_IF_ERROR(e.Forward({&pe, 1}, &pl));
    for (int i = 0; i < 5; ++i) {
      drafts.push_back(Argmax(pl.data(), vocab));
      BatchEntry d{probe, {&drafts.back(), 1}, false};
      SPECNODE_RETURN_IF_ERROR(e.Forward({&d, 1}, &pl));
    }
    e.Free(probe);
  }
  for (int32_t t : drafts) r.tokens.push_back(t);
  const int32_t n0 = static_cast<int32_t>(p.ids.size());
  BatchEntry v{seq, drafts, true};  // last token + 4 drafts
  SPECNODE_RETURN_IF_ERROR(e.Forward({&v, 1}, &logits));
  r.Pass(logits);
  SPECNODE_RETURN_IF_ERROR(e.Truncate(seq, n0 + 3));
  const std::vector<int32_t> wrong = {drafts[3], 100, 200, 300};
  BatchEntry w{seq, wrong, true};
  SPECNODE_RETURN_IF_ERROR(e.Forward({&w, 1}, &logits));
  r.Pass(logits);
  SPECNODE_RETURN_IF_ERROR(e.Truncate(seq, n0 + 4));
  int32_t t = Argmax(logits.data(), vocab);  // row 0: after drafts[3]
  for (int i = 0; i < 6; ++i) {
    r.tokens.push_back(t);
    BatchEntry d{seq, {&t, 1}, false};
    SPECNODE_RETURN_IF_ERROR(e.Forward({&d, 1}, &logits));
    r.Pass(logits);
    t = Argmax(logits.data(), vocab);
  }
  e.Free(seq);
  return r.Done();
}

absl::StatusOr<json> CaptureAll(const std::string& model_path, const std::string& long_text) {
  json cases = json::object();
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<GoldenModel> probe,
                            GoldenModel::Load(model_path, ActQuant::kInt16, {}));
  SPECNODE_ASSIGN_OR_RETURN(const std::vector<Prompt> prompts, Prompts(*probe, long_text));
  probe.reset();
  for (ActQuant act : {ActQuant::kInt16, ActQuant::kInt8}) {
    const std::string a = act == ActQuant::kInt16 ? "int16" : "int8";
    for (int tp : {1, 3}) {
      const std::vector<std::string> modes =
          tp == 1 ? std::vector<std::string>{"dense", "full", "int8", "int4", "mixed"}
                  : std::vector<std::string>{"full", "mixed"};
      for (const std::string& mode : modes) {
        SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<GoldenEngine> e,
                                  GoldenEngine::Create(model_path, act, mode, tp));
        const std::string prefix = absl::StrFormat("%s/%s%s", a, tp == 1 ? "" : "tp3-", mode);
        std::fprintf(stderr, "golden_capture: %s\n", prefix.c_str());
        for (const Prompt& p : prompts) {
          if (tp > 1 && p.name != "capital" && p.name != "long") continue;
          SPECNODE_ASSIGN_OR_RETURN(cases[prefix + "/single/" + p.name],
                                    Single(*e, p, p.name == "long" ? 16 : 10));
        }
        SPECNODE_ASSIGN_OR_RETURN(cases[prefix + "/batch"], Batch(*e, prompts, 8));
        SPECNODE_ASSIGN_OR_RETURN(cases[prefix + "/verify"], Verify(*e, prompts[0]));
      }
    }
  }
  return cases;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int Main(int argc, char** argv) {
  std::string model, write_dir, check_dir, expect_kernels,
      long_text_path = "tests/data/kv-eval/01-lighthouse-history.txt";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--model")
      model = argv[i + 1];
    else if (k == "--write")
      write_dir = argv[i + 1];
    else if (k == "--check")
      check_dir = argv[i + 1];
    else if (k == "--long-text")
      long_text_path = argv[i + 1];
    else if (k == "--expect-kernels")
      expect_kernels = argv[i + 1];
    else {
      std::fprintf(stderr, "golden_capture: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (model.empty()) {
    const char* env = std::getenv("SPECNODE_MODEL");
    if (env != nullptr) model = env;
  }
  if (model.empty() || (write_dir.empty() == check_dir.empty())) {
    std::fprintf(stderr,
                 "usage: golden_capture --model M.gguf (--write DIR | --check DIR) "
                 "[--long-text FILE]\n");
    const char* require = std::getenv("SPECNODE_REQUIRE_MODEL");
    if (model.empty() && !check_dir.empty()) {
      if (require != nullptr && std::string(require) == "1") return 1;
      std::fprintf(stderr, "golden_capture: SKIP: no model (set SPECNODE_MODEL)\n");
      return kSkip;
    }
    return 2;
  }
  const std::string kernels = CpuKernelName();
  if (!expect_kernels.empty() && expect_kernels != kernels) {
    const char* cap = std::getenv("SPECNODE_CPU");
    std::fprintf(stderr,
                 "golden_capture: SKIP: %s kernels asked (SPECNODE_CPU=%s), this CPU runs %s\n",
                 expect_kernels.c_str(), cap == nullptr ? "" : cap, kernels.c_str());
    return kSkip;
  }
  const std::string long_text = ReadFile(long_text_path);
  if (long_text.empty()) {
    std::fprintf(stderr, "golden_capture: cannot read %s\n", long_text_path.c_str());
    return 1;
  }
  const std::string file = (write_dir.empty() ? check_dir : write_dir) + "/" + kernels + ".json";
  json golden;
  if (!check_dir.empty()) {
    const std::string text = ReadFile(file);
    if (text.empty()) {
      std::fprintf(stderr, "golden_capture: SKIP: no goldens for %s kernels (%s)\n",
                   kernels.c_str(), file.c_str());
      return kSkip;
    }
    golden = json::parse(text);
  }
  absl::StatusOr<json> cases = CaptureAll(model, long_text);
  if (!cases.ok()) {
    std::fprintf(stderr, "golden_capture: %s\n", std::string(cases.status().message()).c_str());
    return 1;
  }
  if (!write_dir.empty()) {
    json out = {{"kernels", kernels}, {"cases", *cases}};
    std::ofstream f(file);
    f << out.dump(1) << "\n";
    f.close();
    if (!f) {  // a missing directory, a full disk: say so rather than claim the write
      std::fprintf(stderr, "golden_capture: cannot write %s\n", file.c_str());
      return 1;
    }
    std::fprintf(stderr, "golden_capture: wrote %zu cases to %s\n", cases->size(), file.c_str());
    return 0;
  }
  int bad = 0;
  const json& want = golden["cases"];
  for (auto it = want.begin(); it != want.end(); ++it) {
    if (!cases->contains(it.key())) {
      std::fprintf(stderr, "MISSING %s\n", it.key().c_str());
      ++bad;
      continue;
    }
    const json& got = (*cases)[it.key()];
    if (got == it.value()) continue;
    ++bad;
    const json& wh = it.value()["hashes"];
    const json& gh = got["hashes"];
    size_t pass = 0;
    while (pass < wh.size() && pass < gh.size() && wh[pass] == gh[pass]) ++pass;
    std::fprintf(
        stderr, "DIFF %s: first differing pass %zu; tokens %s vs golden %s; top %s vs %s\n",
        it.key().c_str(), pass, got["tokens"].dump().c_str(), it.value()["tokens"].dump().c_str(),
        got["top"].dump().c_str(), it.value()["top"].dump().c_str());
  }
  for (auto it = cases->begin(); it != cases->end(); ++it) {
    if (!want.contains(it.key())) {
      std::fprintf(stderr, "EXTRA %s (not in the goldens)\n", it.key().c_str());
      ++bad;
    }
  }
  std::fprintf(stderr, "golden_capture: %s kernels: %zu cases, %d differ\n", kernels.c_str(),
               want.size(), bad);
  return bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace specnode

int main(int argc, char** argv) { return specnode::Main(argc, argv); }

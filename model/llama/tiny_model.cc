#include "model/llama/tiny_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/cpu/thread_pool.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/gguf_writer.h"
#include "model/llama/llama_arch.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

// Merges are learned by plain BPE on this text, so they are the frequent English pairs a
// real tokenizer would have ("Ġ t", "h e", "Ġt he", ...). Changing it changes every file.
constexpr std::string_view kCorpus =
    "The quick brown fox jumps over the lazy dog. Once upon a time there was a little "
    "house at the edge of the forest, and in the house there lived an old man with his "
    "three daughters. Every morning the old man went into the forest to cut wood, and "
    "every evening he came home and sat by the fire while his daughters made the supper. "
    "One day the youngest daughter said that she would like to see the world beyond the "
    "trees. Her father told her that the world was large and that the road was long, but "
    "she was not afraid. She packed some bread and cheese, said goodbye to her sisters, "
    "and walked along the river until the sun went down. In the evening she reached a "
    "town where the people were singing in the streets. They asked her where she had come "
    "from and what she wanted to find. She answered that she wanted to learn how other "
    "people lived, what they thought about, and why they were happy or sad. The people "
    "laughed and gave her a room for the night. The next morning she went to the market "
    "and watched the traders selling fruit, cloth, tools and books. A teacher who was "
    "standing there offered to show her the library, and she spent the whole day reading "
    "about the stars, the sea, the mountains and the history of the kingdom. When she "
    "finally returned to her father's house, she told her sisters everything she had seen "
    "and heard. They listened until late in the night, and from that day on the three of "
    "them often talked about travelling together. Questions are the beginning of "
    "knowledge, and the answers we find should lead us to better questions. This is "
    "something that every student and every scientist understands. What is the weather "
    "like today? It is warm and sunny, with a light wind from the west. Would you like "
    "some tea or coffee? I would prefer a glass of water, thank you. The computer is "
    "running a program that reads the input, processes the information and writes the "
    "result to the output. Language models predict the next token given the previous "
    "tokens, and they are trained on large amounts of text.";

constexpr std::string_view kControlTokens[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

// SmolLM2-135M-Instruct's template, byte for byte (real newlines inside the literals).
constexpr std::string_view kChatTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

constexpr int kMaxMerges = 200000;  // Llama 3's 128256-token vocabulary needs 127997
// 16G parameters (~9 GB at Q4_0): the real-shape benchmark models (ApplyTinyModelShape) fit.
constexpr int64_t kMaxParameters = int64_t{1} << 34;

// ---- Deterministic randomness (integer and IEEE arithmetic only, so files are the same
// on every platform and compiler).

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

class Rng {
 public:
  Rng(uint64_t seed, std::string_view stream) : state_(seed ^ Fnv1a(stream)) { SplitMix64(state_); }
  // Approximately standard normal: Irwin-Hall sum of 12 uniforms (mean 0, variance 1).
  // Bounded at +-6, which is harmless for weights and avoids libm differences.
  float Normal() {
    double sum = 0.0;
    for (int i = 0; i < 12; ++i) sum += static_cast<double>(SplitMix64(state_) >> 11) * 0x1p-53;
    return static_cast<float>(sum - 6.0);
  }
  // Moves to where `values` Normal() calls from here would leave the stream: SplitMix64's
  // state advances by a constant per draw, 12 draws a value.
  void SkipNormals(int64_t values) {
    state_ += static_cast<uint64_t>(values) * 12u * 0x9e3779b97f4a7c15ull;
  }

 private:
  uint64_t state_;
};

// ---- Vocabulary.

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the rest to
// U+0100 upwards in byte order. Returns the UTF-8 text of byte b's token.
std::string ByteToken(int b) {
  auto printable = [](int x) {
    return (x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff);
  };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int x = 0; x < b; ++x) n += printable(x) ? 0 : 1;
    cp = 256 + n;
  }
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
  return out;
}

enum class CharClass { kLetter, kDigit, kSpace, kOther };

CharClass Classify(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::kLetter;
  if (c >= '0' && c <= '9') return CharClass::kDigit;
  if (c == ' ' || c == '\n' || c == '\t') return CharClass::kSpace;
  return CharClass::kOther;
}

// Splits like the GPT-2 regex does on ASCII: an optional single space, then a run of one
// class; digits alone (as SmolLM's pre-tokenizer does).
std::vector<std::string_view> Words(std::string_view text) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < text.size()) {
    const size_t start = i;
    if (text[i] == ' ' && i + 1 < text.size() && Classify(text[i + 1]) != CharClass::kSpace) ++i;
    const CharClass cls = Classify(text[i]);
    ++i;
    if (cls != CharClass::kDigit) {
      while (i < text.size() && Classify(text[i]) == cls) ++i;
    }
    words.push_back(text.substr(start, i - start));
  }
  return words;
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<std::string> merges;
};

// Byte tokens, then n_merges merged tokens (BPE on kCorpus; when the corpus runs out of
// pairs, synthetic letter extensions), then the control tokens. Every merge joins two
// existing tokens into a new one.
Vocab BuildVocab(int n_merges) {
  Vocab v;
  std::set<std::string> known;
  std::vector<std::string> byte_tok(256);
  for (int b = 0; b < 256; ++b) {
    byte_tok[b] = ByteToken(b);
    v.tokens.push_back(byte_tok[b]);
    known.insert(byte_tok[b]);
  }
  auto emit = [&](const std::string& a, const std::string& b) {
    v.merges.push_back(absl::StrCat(a, " ", b));
    v.tokens.push_back(a + b);
    known.insert(a + b);
  };

  // Unique words with counts, each as a list of byte-level symbols.
  std::map<std::string, int> word_count;
  for (std::string_view w : Words(kCorpus)) ++word_count[std::string(w)];
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [w, n] : word_count) {
    std::vector<std::string> symbols;
    for (unsigned char c : w) symbols.push_back(byte_tok[c]);
    words.emplace_back(std::move(symbols), n);
  }

  while (static_cast<int>(v.merges.size()) < n_merges) {
    std::map<std::pair<std::string, std::string>, int> pair_count;
    for (const auto& [symbols, n] : words) {
      for (size_t i = 0; i + 1 < symbols.size(); ++i) pair_count[{symbols[i], symbols[i + 1]}] += n;
    }
    if (pair_count.empty()) break;
    // Most frequent pair; ties go to the smallest pair (map order), for determinism.
    auto best = pair_count.begin();
    for (auto it = pair_count.begin(); it != pair_count.end(); ++it) {
      if (it->second > best->second) best = it;
    }
    const auto [a, b] = best->first;
    for (auto& [symbols, n] : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
          merged.push_back(a + b);
          ++i;
        } else {
          merged.push_back(symbols[i]);
        }
      }
      symbols = std::move(merged);
    }
    // Another merge may already have produced this text; it applies to the corpus but
    // adds no token, so it is not emitted.
    if (known.count(a + b) == 0) emit(a, b);
  }

  // Synthetic extensions: each token (letters first, then merged tokens, including the
  // ones made here) followed by a letter, when that text is new.
  std::vector<std::string> bases;
  for (char c = 'a'; c <= 'z'; ++c) bases.push_back(byte_tok[static_cast<unsigned char>(c)]);
  for (size_t i = 256; i < v.tokens.size(); ++i) bases.push_back(v.tokens[i]);
  for (size_t i = 0; i < bases.size() && static_cast<int>(v.merges.size()) < n_merges; ++i) {
    const std::string base = bases[i];  // copy: bases grows below
    for (char c = 'a'; c <= 'z' && static_cast<int>(v.merges.size()) < n_merges; ++c) {
      const std::string& letter = byte_tok[static_cast<unsigned char>(c)];
      if (known.count(base + letter) != 0) continue;
      emit(base, letter);
      bases.push_back(v.tokens.back());
    }
  }
  for (std::string_view t : kControlTokens) v.tokens.emplace_back(t);
  return v;
}

// ---- Weights.

uint32_t FileType(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ4_0:
      return 2;
    case GgmlType::kQ4_1:
      return 3;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kQ5_0:
      return 8;
    case GgmlType::kQ5_1:
      return 9;
    case GgmlType::kQ4_K:
      return 15;  // MOSTLY_Q4_K_M
    case GgmlType::kQ5_K:
      return 17;  // MOSTLY_Q5_K_M
    case GgmlType::kQ6_K:
      return 18;
    case GgmlType::kBF16:
      return 32;
  }
  return 0;
}

int HeadDim(const TinyModelOptions& o) {
  return o.head_dim != 0 ? o.head_dim : o.d_model / o.n_heads;
}

absl::Status Validate(const TinyModelOptions& o) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (FindArch(o.arch) == nullptr) {
    return bad("arch '", o.arch, "' is not one of ", SupportedArchitectures());
  }
  if (o.n_layers < 1 || o.n_layers > 256) return bad("n_layers ", o.n_layers, " not in [1, 256]");
  if (o.d_model < 32 || o.d_model > 16384 || o.d_model % 32 != 0) {
    return bad("d_model ", o.d_model, " is not a multiple of 32 in [32, 16384]");
  }
  if (o.n_heads < 1 || o.n_heads > 1024) return bad("n_heads ", o.n_heads, " not in [1, 1024]");
  if (o.head_dim == 0 && o.d_model % o.n_heads != 0) {
    return bad("n_heads ", o.n_heads, " does not divide d_model ", o.d_model);
  }
  if (o.head_dim < 0 || o.head_dim > 1024) return bad("head_dim ", o.head_dim, " not in [0, 1024]");
  const int head_dim = HeadDim(o);
  if (head_dim % 2 != 0) return bad("head_dim ", head_dim, " is odd; RoPE needs pairs");
  if (int64_t{o.n_heads} * head_dim % 32 != 0) {
    return bad("n_heads x head_dim ", int64_t{o.n_heads} * head_dim, " is not a multiple of 32");
  }
  if (o.n_kv_heads < 1 || o.n_heads % o.n_kv_heads != 0) {
    return bad("n_kv_heads ", o.n_kv_heads, " does not divide n_heads ", o.n_heads);
  }
  if (o.d_ff < 32 || o.d_ff > 65536 || o.d_ff % 32 != 0) {
    return bad("d_ff ", o.d_ff, " is not a multiple of 32 in [32, 65536]");
  }
  if (o.n_merges < 0 || o.n_merges > kMaxMerges) {
    return bad("n_merges ", o.n_merges, " not in [0, ", kMaxMerges, "]");
  }
  if (!std::isfinite(o.rope_scale) || o.rope_scale < 0.0f || o.rope_scale > 1024.0f) {
    return bad("rope_scale ", o.rope_scale, " not in [0, 1024]");
  }
  if (o.sliding_window < 0 || o.sliding_window > (1 << 24)) {
    return bad("sliding_window ", o.sliding_window, " not in [0, 2^24]");
  }
  if (o.context_length < 1 || o.context_length > (1 << 24)) {
    return bad("context_length ", o.context_length, " not in [1, 2^24]");
  }
  if (!std::isfinite(o.rope_base) || o.rope_base <= 1.0f) {
    return bad("rope_base ", o.rope_base, " must be > 1");
  }
  if (!std::isfinite(o.rms_eps) || o.rms_eps <= 0.0f || o.rms_eps >= 1.0f) {
    return bad("rms_eps ", o.rms_eps, " not in (0, 1)");
  }
  if (!IsSupportedGgmlType(static_cast<uint32_t>(o.weight_type))) {
    return bad("weight_type ", static_cast<uint32_t>(o.weight_type), " is not supported");
  }
  if (!std::isfinite(o.perturb) || o.perturb < 0.0f || o.perturb > 100.0f) {
    return bad("perturb ", o.perturb, " not in [0, 100]");
  }
  if (o.threads < 0 || o.threads > 1024) return bad("threads ", o.threads, " not in [0, 1024]");
  const int64_t d = o.d_model, q = int64_t{o.n_heads} * head_dim,
                kv = int64_t{o.n_kv_heads} * head_dim, ff = o.d_ff;
  const int64_t vocab = 256 + o.n_merges + 3;
  const int64_t per_layer = 4 * d + 2 * d * q + 2 * d * kv + 3 * d * ff + q + 2 * kv + 2 * head_dim;
  const int64_t total = vocab * d * (o.tied_embeddings ? 1 : 2) + d + o.n_layers * per_layer;
  if (total > kMaxParameters) {
    return bad("model too large: ", total, " parameters (limit ", kMaxParameters, ")");
  }
  return absl::OkStatus();
}

class TensorMaker {
 public:
  TensorMaker(const TinyModelOptions& o, GgufWriter& w, ThreadPool& pool)
      : o_(o), w_(w), pool_(pool) {}

  // values ~ mean + stddev * N(0,1), then the optional perturbation, then encoded; the
  // values and the rows' encoding split over the pool (the same bytes as one thread).
  // `adjust` (may be null) edits the values once drawn (and perturbed).
  absl::Status Add(const std::string& name, GgmlType type, std::vector<int64_t> dims, float mean,
                   float stddev, const std::function<void(std::vector<float>&)>& adjust = nullptr) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    std::vector<float> values(static_cast<size_t>(n));
    const uint64_t seed = o_.seed;
    pool_.ParallelFor(n, kGrain, [&](int64_t begin, int64_t end, int) {
      Rng rng(seed, name);
      rng.SkipNormals(begin);
      for (int64_t i = begin; i < end; ++i) values[i] = mean + stddev * rng.Normal();
    });
    if (o_.perturb > 0.0f) {
      // Noise relative to the tensor's own spread, from a stream independent of `seed`.
      double sum = 0.0, sum_sq = 0.0;
      for (float v : values) sum += v;
      const double avg = sum / static_cast<double>(n);
      for (float v : values) sum_sq += (v - avg) * (v - avg);
      const float scale =
          o_.perturb * static_cast<float>(std::sqrt(sum_sq / static_cast<double>(n)));
      const uint64_t noise_seed = o_.perturb_seed ^ 0x5bd1e9955bd1e995ull;
      pool_.ParallelFor(n, kGrain, [&](int64_t begin, int64_t end, int) {
        Rng noise(noise_seed, name);
        noise.SkipNormals(begin);
        for (int64_t i = begin; i < end; ++i) values[i] += scale * noise.Normal();
      });
    }
    if (adjust) adjust(values);
    // As llama.cpp's quantiser: a K-quant needs rows of whole 256-value blocks; narrower
    // matrices fall back (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0).
    if (dims[0] % kKQuantBlock != 0) {
      if (type == GgmlType::kQ4_K) type = GgmlType::kQ5_0;
      if (type == GgmlType::kQ5_K) type = GgmlType::kQ5_1;
      if (type == GgmlType::kQ6_K) type = GgmlType::kQ8_0;
    }
    if (dims[0] % GgmlBlockSize(type) != 0) return w_.AddTensorF32(name, type, dims, values);
    // As GgufWriter::AddTensorF32, row by row over the pool.
    const int64_t cols = dims[0], rows = n / cols;
    const size_t row_bytes = GgmlRowBytes(type, cols);
    std::string data(row_bytes * static_cast<size_t>(rows), '\0');
    pool_.ParallelFor(
        rows, std::max<int64_t>(1, kGrain / cols), [&](int64_t begin, int64_t end, int) {
          for (int64_t r = begin; r < end; ++r) {
            QuantizeRow(type, values.data() + r * cols, data.data() + r * row_bytes, cols);
          }
        });
    return w_.AddTensor(name, type, dims, std::move(data));
  }

 private:
  static constexpr int64_t kGrain = int64_t{1} << 16;  // values a chunk at least

  const TinyModelOptions& o_;
  GgufWriter& w_;
  ThreadPool& pool_;
};

}  // namespace

absl::Status ApplyTinyModelShape(std::string_view name, TinyModelOptions* o) {
  constexpr int kLlama3Vocab = 128256;
  auto llama3 = [&](int layers, int d, int heads, int ff) {
    o->arch = "llama";
    o->n_layers = layers;
    o->d_model = d;
    o->n_heads = heads;
    o->n_kv_heads = 8;
    o->head_dim = 0;  // d / heads = 128
    o->d_ff = ff;
    o->n_merges = kLlama3Vocab - 256 - 3;
    o->context_length = 8192;
    o->rope_base = 500000.0f;
    o->tied_embeddings = false;
    o->weight_type = GgmlType::kQ4_0;
  };
  if (name == "llama3-8b") {
    llama3(32, 4096, 32, 14336);
  } else if (name == "llama3-70b-layer") {
    llama3(1, 8192, 64, 28672);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown shape '", std::string(name),
                                                   "' (known: llama3-8b, llama3-70b-layer)"));
  }
  return absl::OkStatus();
}

absl::Status WriteTinyModel(const TinyModelOptions& options, const std::string& path) {
  const TinyModelOptions& o = options;
  SPECNODE_RETURN_IF_ERROR(Validate(o));
  const int head_dim = HeadDim(o);
  const int64_t d = o.d_model, q_dim = int64_t{o.n_heads} * head_dim,
                kv_dim = int64_t{o.n_kv_heads} * head_dim, ff = o.d_ff;
  const Vocab vocab = BuildVocab(o.n_merges);
  const auto n_vocab = static_cast<int64_t>(vocab.tokens.size());
  const auto id_of = [&](int control) { return static_cast<uint32_t>(n_vocab - 3 + control); };

  const ArchTraits& arch = *FindArch(o.arch);
  const std::string a = o.arch + ".";
  GgufWriter w;
  w.AddString("general.architecture", o.arch);
  w.AddString("general.type", "model");
  w.AddString("general.name", "specnode-tiny");
  w.AddUint32(a + "block_count", static_cast<uint32_t>(o.n_layers));
  w.AddUint32(a + "context_length", static_cast<uint32_t>(o.context_length));
  w.AddUint32(a + "embedding_length", static_cast<uint32_t>(o.d_model));
  w.AddUint32(a + "feed_forward_length", static_cast<uint32_t>(o.d_ff));
  w.AddUint32(a + "attention.head_count", static_cast<uint32_t>(o.n_heads));
  w.AddUint32(a + "attention.head_count_kv", static_cast<uint32_t>(o.n_kv_heads));
  w.AddFloat32(a + "rope.freq_base", o.rope_base);
  w.AddFloat32(a + "attention.layer_norm_rms_epsilon", o.rms_eps);
  w.AddUint32("general.file_type", FileType(o.weight_type));
  w.AddUint32(a + "vocab_size", static_cast<uint32_t>(n_vocab));
  w.AddUint32(a + "rope.dimension_count", static_cast<uint32_t>(head_dim));
  if (head_dim * o.n_heads != o.d_model) {
    w.AddUint32(a + "attention.key_length", static_cast<uint32_t>(head_dim));
    w.AddUint32(a + "attention.value_length", static_cast<uint32_t>(head_dim));
  }
  if (o.sliding_window > 0) {
    w.AddUint32(a + "attention.sliding_window", static_cast<uint32_t>(o.sliding_window));
  }
  if (o.rope_scale > 1.0f) {
    w.AddString(a + "rope.scaling.type", "linear");
    w.AddFloat32(a + "rope.scaling.factor", o.rope_scale);
  }
  w.AddBool("tokenizer.ggml.add_space_prefix", false);
  w.AddBool("tokenizer.ggml.add_bos_token", false);
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "smollm");
  w.AddStringArray("tokenizer.ggml.tokens", vocab.tokens);
  std::vector<int32_t> types(static_cast<size_t>(n_vocab), 1);
  for (int i = 0; i < 3; ++i) types[id_of(i)] = 3;
  w.AddInt32Array("tokenizer.ggml.token_type", types);
  w.AddStringArray("tokenizer.ggml.merges", vocab.merges);
  // As SmolLM2: bos = <|im_start|>, eos = pad = <|im_end|>, unk = <|endoftext|>.
  w.AddUint32("tokenizer.ggml.bos_token_id", id_of(1));
  w.AddUint32("tokenizer.ggml.eos_token_id", id_of(2));
  w.AddUint32("tokenizer.ggml.unknown_token_id", id_of(0));
  w.AddUint32("tokenizer.ggml.padding_token_id", id_of(2));
  w.AddString("tokenizer.chat_template", std::string(kChatTemplate));
  if (GgmlBlockSize(o.weight_type) > 1) w.AddUint32("general.quantization_version", 2);

  // Scales: projections into the residual-branch ~ 1/sqrt(fan_in) so each activation is
  // O(1); projections back into the residual stream are further divided by
  // sqrt(2 * n_layers) (GPT-2 style) so the stream stays O(1) in depth; the head is
  // scaled up so logits have a spread of a few units (peaked but not one-hot).
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float depth = 1.0f;
  const float head_scale = 2.5f * in_scale;
  const GgmlType wt = o.weight_type;
  const int threads = o.threads > 0
                          ? o.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ThreadPool pool(threads);
  TensorMaker m(o, w, pool);
  SPECNODE_RETURN_IF_ERROR(m.Add("token_embd.weight", wt, {d, n_vocab}, 0.0f, head_scale));
  SPECNODE_RETURN_IF_ERROR(m.Add("output_norm.weight", GgmlType::kF32, {d}, 1.0f, 0.05f));
  if (o.rope_freqs) {
    const int pairs = head_dim / 2;
    std::vector<float> factors(pairs);
    for (int i = 0; i < pairs; ++i) {
      factors[i] = 1.0f + 7.0f * static_cast<float>(i) / static_cast<float>(std::max(1, pairs - 1));
    }
    SPECNODE_RETURN_IF_ERROR(w.AddTensorF32("rope_freqs.weight", GgmlType::kF32, {pairs}, factors));
  }
  if (!o.tied_embeddings) {
    SPECNODE_RETURN_IF_ERROR(m.Add("output.weight", wt, {d, n_vocab}, 0.0f, head_scale));
  }
  for (int l = 0; l < o.n_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    SPECNODE_RETURN_IF_ERROR(m.Add(p + "attn_norm.weight", GgmlType::kF32, {d}, 1.0f, 0.05f));
    SPECNODE_RETURN_IF_ERROR(m.Add(p + "attn_q.weight", wt, {d, q_dim}, 0.0f, in_scale));
    SPECNODE_RETURN_IF_ERROR(m.Add(p + "attn_k.weight", wt, {d, kv_dim}, 0.0f, in_scale));
    SPECNODE_RETURN_IF_ERROR(m.Add(p + "attn_v.weight", wt, {d, kv_dim}, 0.0f, in_scale));
    if (arch.qkv_bias) {
      // Biases of the size of the projections' own spread (Qwen2's K biases are large):
      // a graph that dropped or misplaced them would be far off.
      SPECNODE_RETURN_IF_ERROR(m.Add(p + "attn_q.bias", GgmlType::kF32, {q_dim}, 0.0f, 0.5f));
      // k_bias_outlier: on the slowest RoPE pair of each kv head, as Qwen2.5's files have.
      std::function<void(std::vector<float>&)> outlier;
      if (o.k_bias_outlier != 0.0f) outlier = [&](std::vector<float>& b) {
        for (int h = 0; h < o.n_kv_heads; ++h) {
          b[static_cast<size_t>(h) * head_dim + head_dim / 2 - 1] += o.k_bias_outlier;
          b[static_cast<size_t>(h + 1) * head_dim - 1] -= 0.5f * o.k_bias_outlier;
        }
      };
      SPECNODE_RETURN_IF_ERROR(m.Add(p + "attn_k.bias", GgmlType::kF32, {kv_dim}, 0.0f, 0.5f,
                                     outlier));
      SPECNODE_RETURN_IF_ERROR(m.Add(p + "attn_v.bias", GgmlType::kF32, {kv_dim}, 0.0f, 0.5f));
    }
    if (arch.qk_norm) {
      SPECNODE_RETURN_IF_ERROR(
          m.Add(p + "attn_q_norm.weight", GgmlType::kF32, {head_dim}, 1.0f, 0.2f));
      SPECNODE_RETURN_IF_ERROR(
          m.Add(p + "attn_k_norm.weight", GgmlType::kF32, {head_dim}, 1.0f, 0.2f));
    }
    SPECNODE_RETURN_IF_ERROR(m.Add(p + "attn_output.weight", wt, {q_dim, d}, 0.0f,
                                   depth / std::sqrt(static_cast<float>(q_dim))));
    SPECNODE_RETURN_IF_ERROR(m.Add(p + "ffn_norm.weight", GgmlType::kF32, {d}, 1.0f, 0.05f));
    if (arch.post_norms) {
      // Stored as llama.cpp's converter stores Gemma's (1 + w): factors around 1.
      SPECNODE_RETURN_IF_ERROR(
          m.Add(p + "post_attention_norm.weight", GgmlType::kF32, {d}, 1.0f, 0.2f));
      SPECNODE_RETURN_IF_ERROR(m.Add(p + "post_ffw_norm.weight", GgmlType::kF32, {d}, 1.0f, 0.2f));
    }
    SPECNODE_RETURN_IF_ERROR(m.Add(p + "ffn_gate.weight", wt, {d, ff}, 0.0f, in_scale));
    SPECNODE_RETURN_IF_ERROR(m.Add(p + "ffn_up.weight", wt, {d, ff}, 0.0f, in_scale));
    SPECNODE_RETURN_IF_ERROR(
        m.Add(p + "ffn_down.weight", wt, {ff, d}, 0.0f, depth / std::sqrt(static_cast<float>(ff))));
  }
  return w.WriteFile(path);
}

}  // namespace specnode

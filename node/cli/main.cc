// specnode: one binary, several subcommands (git style).
#include <sched.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "node/cli/commands.h"

namespace specnode {

std::string DefaultModelPath() {
  if (const char* env = std::getenv("SPECNODE_MODEL"); env != nullptr && *env != '\0') return env;
  std::string cache;
  if (const char* env = std::getenv("SPECNODE_CACHE"); env != nullptr && *env != '\0') {
    cache = env;
  } else if (const char* home = std::getenv("HOME"); home != nullptr) {
    cache = std::string(home) + "/.cache/specnode";
  } else {
    cache = ".cache/specnode";
  }
  return cache + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

int DefaultThreads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace specnode

namespace {

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: specnode <command> [options]\n"
               "\n"
               "commands:\n"
               "  generate    generate text from a prompt (streams to stdout)\n"
               "  tokenize    encode text or decode ids with a model's tokenizer\n"
               "  logits      write the logits of a token list to a file\n"
               "  bench       prefill/decode tokens/s at several batch sizes\n"
               "  kv-eval     KV cache precision modes: bytes per token vs accuracy\n"
               "  spec-bench  speculative decoding per drafter and domain vs target-only\n"
               "  serve       the node: ZeroMQ front end, continuous batching, speculation\n"
               "  tiny-model  write a small deterministic Llama GGUF\n"
               "  tune        try a config's optimisations against a measured baseline\n"
               "  error-codes the error codes of the node's replies\n"
               "\n"
               "Run 'specnode <command> --help' for its options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    Usage(stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    Usage(stdout);
    return 0;
  }
  char** sub_argv = argv + 1;
  const int sub_argc = argc - 1;
  if (cmd == "generate") return specnode::RunGenerate(sub_argc, sub_argv);
  if (cmd == "tokenize") return specnode::RunTokenize(sub_argc, sub_argv);
  if (cmd == "logits") return specnode::RunLogits(sub_argc, sub_argv);
  if (cmd == "bench") return specnode::RunBench(sub_argc, sub_argv);
  if (cmd == "kv-eval") return specnode::RunKvEval(sub_argc, sub_argv);
  if (cmd == "spec-bench") return specnode::RunSpecBench(sub_argc, sub_argv);
  if (cmd == "serve") return specnode::RunServe(sub_argc, sub_argv);
  if (cmd == "tiny-model") return specnode::RunTinyModel(sub_argc, sub_argv);
  if (cmd == "tune") return specnode::RunTune(sub_argc, sub_argv);
  if (cmd == "error-codes") return specnode::RunErrorCodes(sub_argc, sub_argv);
  std::fprintf(stderr, "specnode: unknown command '%s'\n", cmd.c_str());
  Usage(stderr);
  return 2;
}

// Subcommands of the specnode binary. Each takes (argc, argv) with argv[0] the subcommand
// name, prints errors as "specnode <cmd>: <message>" on stderr, and returns 0 on success,
// 1 on failure, 2 on a usage error.
#pragma once

#include <string>

namespace specnode {

int RunGenerate(int argc, char** argv);   // stream text from a prompt
int RunLogits(int argc, char** argv);     // dump logits of a token list (oracle tests)
int RunBench(int argc, char** argv);      // prefill/decode throughput at several batch sizes
int RunKvEval(int argc, char** argv);     // KV precision modes: bytes vs accuracy on texts
int RunSpecBench(int argc, char** argv);  // speculative decoding per drafter and domain
int RunServe(int argc, char** argv);      // the node: ZeroMQ front end + scheduler
int RunTokenize(int argc, char** argv);   // encode/decode text with a model's tokenizer
int RunTinyModel(int argc, char** argv);  // write a small deterministic Llama GGUF
int RunTune(int argc, char** argv);       // tune a serve config against a measured baseline
int RunErrorCodes(int argc, char** argv); // list the error codes of the node's replies

// The model path used when --model is absent: $SPECNODE_MODEL, else the file that
// scripts/fetch-model places in the cache ($SPECNODE_CACHE or ~/.cache/specnode).
std::string DefaultModelPath();

// Default thread count: the number of cores this process may run on.
int DefaultThreads();

}  // namespace specnode

// `specnode tokenize`: encode text or decode ids with a model's tokenizer, as JSON.
//
// Loads only the GGUF metadata's tokenizer (no weights are read). Output is one JSON line,
// ASCII only: non-ASCII text appears as \u escapes, bytes that are not valid UTF-8 (a
// piece can be part of a character) as \ufffd.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "model/gguf/gguf_reader.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "node/cli/cli_args.h"
#include "node/cli/commands.h"
#include "node/cli/model_flags.h"
#include "node/serve/openai_api.h"
#include "node/serve/protocol.h"

namespace specnode {
namespace {

constexpr char kUsage[] =
    "usage: specnode tokenize [--model PATH] (--text TEXT | --decode 1,2,3 | --messages JSON)\n"
    "         [--special] [--chat [--chat-template NAME]]\n"
    "\n"
    "  --model PATH   GGUF file (default: $SPECNODE_MODEL or the fetch-model cache)\n"
    "  --text TEXT    encode TEXT; prints {\"ids\":[...],\"pieces\":[...]}\n"
    "  --decode IDS   decode comma-separated ids; prints {\"text\":\"...\"}\n"
    "  --special      encode: match special tokens in the text; decode: render them\n"
    "  --chat         encode TEXT as one user turn of the model's chat template\n"
    "                 (with the assistant opener; implies --special); adds \"prompt\",\n"
    "                 the rendered text, to the output\n"
    "  --messages JSON  encode a conversation, [{\"role\": \"system\"|\"user\"|\"assistant\",\n"
    "                 \"content\": \"...\"}, ...] as the chat API takes it (also the\n"
    "                 \"developer\" role and text parts), rendered by the chat template as\n"
    "                 the API renders it (with the assistant opener; implies --chat)\n"
    "  --chat-template NAME  chatml, llama3, zephyr, gemma, mistral or llama2 instead of the\n"
    "                 file's template\n";

int Fail(int code, absl::string_view message) {
  std::fprintf(stderr, "specnode tokenize: %.*s\n", static_cast<int>(message.size()),
               message.data());
  return code;
}

int Usage(absl::string_view message) {
  Fail(2, message);
  std::fputs(kUsage, stderr);
  return 2;
}

// ASCII-only JSON; invalid UTF-8 becomes U+FFFD rather than an exception.
void PrintJson(const nlohmann::json& j) {
  const std::string s =
      j.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  std::printf("%s\n", s.c_str());
}

}  // namespace

int RunTokenize(int argc, char** argv) {
  absl::StatusOr<CliArgs> args =
      CliArgs::Parse(argc, argv, {"model", "text", "decode", "messages", "chat-template"},
                     {"special", "chat", "help"});
  if (!args.ok()) return Usage(args.status().message());
  if (args->Has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const bool messages = args->Has("messages");
  const bool encode = args->Has("text") || messages;
  if (static_cast<int>(args->Has("text")) + static_cast<int>(args->Has("decode")) +
          static_cast<int>(messages) !=
      1) {
    return Usage("give exactly one of --text, --decode and --messages");
  }
  if (!encode && args->Has("chat")) return Usage("--chat applies to --text and --messages only");
  if (args->Has("chat-template") && !args->Has("chat") && !messages)
    return Usage("--chat-template needs --chat or --messages");
  std::vector<ChatMessage> conversation;
  if (messages) {
    // As the chat API parses its request's messages (node/serve/openai_api.h).
    absl::StatusOr<std::vector<ChatMessage>> parsed =
        ParseChatMessages(args->Get("messages"), ProtocolLimits{}.max_messages);
    if (!parsed.ok()) return Usage(absl::StrCat("--messages: ", parsed.status().message()));
    conversation = *std::move(parsed);
  }
  absl::StatusOr<std::string> chat_template = ChatTemplateFromArgs(*args);
  if (!chat_template.ok()) return Usage(chat_template.status().message());
  std::vector<int64_t> ids64;
  if (!encode) {
    absl::StatusOr<std::vector<int64_t>> list = args->GetIntList("decode");
    if (!list.ok()) return Usage(list.status().message());
    ids64 = *std::move(list);
  }
  const std::string path = args->Get("model", DefaultModelPath());
  if (path.empty()) return Usage("--model PATH is required (or set SPECNODE_MODEL)");

  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) return Fail(1, file.status().message());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromGguf(**file);
  if (!tok.ok()) return Fail(1, absl::StrCat(path, ": ", tok.status().message()));
  if (!chat_template->empty()) (*tok)->ReplaceChatTemplate(*chat_template);
  const bool special = args->Has("special");

  if (!encode) {
    std::vector<int32_t> ids;
    ids.reserve(ids64.size());
    for (int64_t id : ids64) {
      if (id < 0 || id >= (*tok)->vocab_size()) {
        return Fail(1, absl::StrCat("token id ", id, " is outside the vocabulary [0, ",
                                    (*tok)->vocab_size(), ")"));
      }
      ids.push_back(static_cast<int32_t>(id));
    }
    PrintJson({{"text", (*tok)->Decode(ids, special)}});
    return 0;
  }

  std::string text = args->Get("text");
  const bool chat = args->Has("chat") || messages;
  if (chat) {
    if (!messages) conversation = {{"user", text}};
    absl::StatusOr<std::string> prompt =
        ApplyChatTemplate((*tok)->spec().chat_template, conversation, true);
    if (!prompt.ok()) return Fail(1, prompt.status().message());
    text = *std::move(prompt);
  }
  absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode(text, special || chat);
  if (!ids.ok()) return Fail(1, ids.status().message());
  nlohmann::json pieces = nlohmann::json::array();
  for (int32_t id : *ids) pieces.push_back((*tok)->TokenToBytes(id, /*render_special=*/true));
  nlohmann::json out = {{"ids", *ids}, {"pieces", pieces}};
  if (chat) out["prompt"] = text;
  PrintJson(out);
  return 0;
}

}  // namespace specnode

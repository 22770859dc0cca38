// Instruct-prompt formatting from the model's tokenizer.chat_template.
//
// specnode does not embed a Jinja interpreter: it recognises the template families it
// supports (ChatML "<|im_start|>role\ncontent<|im_end|>\n", Llama-3 header ids, Zephyr,
// Gemma "<start_of_turn>role\ncontent<end_of_turn>\n")
// by their markers and reproduces them, including a default system message that the
// template inserts when the conversation has none (SmolLM2 does). Unknown templates give
// an Unimplemented status naming the problem rather than a silently wrong prompt.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace specnode {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

// A built-in template by family name, for a file without one or to replace the file's
// (--chat-template NAME, model.chat_template): "chatml", "llama3", "zephyr", "gemma" (Gemma 3's
// rules). Returns that family's template text, which ApplyChatTemplate renders as it renders
// the family's files (a ChatML one without a default system message); InvalidArgument
// naming the known names otherwise.
absl::StatusOr<std::string> BuiltinChatTemplate(std::string_view name);

// Renders messages and, when add_generation_prompt, the assistant turn opener.
absl::StatusOr<std::string> ApplyChatTemplate(const std::string& jinja_template,
                                              const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt);

}  // namespace specnode

#include "model/tokenizer/chat_template.h"

#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/status_macros.h"
#include "model/tokenizer/unicode_data.h"

namespace specnode {
namespace {

constexpr char kImStart[] = "<|im_start|>";
constexpr char kImEnd[] = "<|im_end|>";

bool IsKnownRole(const std::string& role) {
  return role == "system" || role == "user" || role == "assistant" || role == "tool";
}

// Jinja string literal body (after the opening quote) -> its value. Jinja follows Python's
// escapes; the common ones are decoded and any other escaped character is kept as is.
// Returns the index just past the closing quote, or npos when the literal is unterminated.
size_t ParseStringLiteral(std::string_view text, size_t pos, char quote, std::string* value) {
  while (pos < text.size()) {
    const char c = text[pos++];
    if (c == quote) return pos;
    if (c != '\\' || pos >= text.size()) {
      value->push_back(c);
      continue;
    }
    const char e = text[pos++];
    switch (e) {
      case 'n':
        value->push_back('\n');
        break;
      case 't':
        value->push_back('\t');
        break;
      case 'r':
        value->push_back('\r');
        break;
      default:
        value->push_back(e);
        break;  // \\, \', \" and anything else
    }
  }
  return std::string_view::npos;
}

// Every string literal inside the template's {{ }} and {% %} tags, in order. Text outside
// tags is output verbatim by Jinja and may contain stray quotes, so it is skipped.
std::vector<std::string> StringLiterals(std::string_view tmpl) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t open = tmpl.find('{', pos);
    if (open == std::string_view::npos || open + 1 >= tmpl.size()) break;
    const char kind = tmpl[open + 1];
    if (kind != '{' && kind != '%') {
      pos = open + 1;
      continue;
    }
    const std::string_view close = kind == '{' ? "}}" : "%}";
    size_t i = open + 2;
    while (i < tmpl.size() && tmpl.substr(i, 2) != close) {
      const char c = tmpl[i];
      if (c == '\'' || c == '"') {
        std::string value;
        const size_t end = ParseStringLiteral(tmpl, i + 1, c, &value);
        if (end == std::string_view::npos) return out;
        out.push_back(std::move(value));
        i = end;
      } else {
        ++i;
      }
    }
    pos = i + 2;
  }
  return out;
}

// The literal a ChatML template emits when the conversation has no system message, e.g.
// "<|im_start|>system\nYou are ...<|im_end|>\n": a whole system turn in one literal.
std::optional<std::string> DefaultChatMlSystem(std::string_view tmpl) {
  const std::string opener = absl::StrCat(kImStart, "system\n");
  for (std::string& lit : StringLiterals(tmpl)) {
    if (lit.starts_with(opener) && lit.find(kImEnd, opener.size()) != std::string::npos) {
      return std::move(lit);
    }
  }
  return std::nullopt;
}

// Jinja's |trim (Python str.strip): White_Space plus U+001C..U+001F.
std::string Trim(std::string_view s) {
  auto is_space = [](char32_t cp) {
    return unicode::IsWhitespace(cp) || (cp >= 0x1C && cp <= 0x1F);
  };
  size_t begin = 0;
  while (begin < s.size()) {
    char32_t cp = 0;
    const int n = unicode::DecodeUtf8(s, begin, &cp);
    if (n == 0 || !is_space(cp)) break;
    begin += static_cast<size_t>(n);
  }
  size_t end = s.size();
  while (end > begin) {
    // Step back to the start of the last character.
    size_t start = end - 1;
    while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    char32_t cp = 0;
    const int n = unicode::DecodeUtf8(s, start, &cp);
    if (n == 0 || start + static_cast<size_t>(n) != end || !is_space(cp)) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

std::string RenderChatMl(std::string_view tmpl, const std::vector<ChatMessage>& messages,
                         bool add_generation_prompt) {
  std::string out;
  if (messages.front().role != "system") {
    if (std::optional<std::string> system = DefaultChatMlSystem(tmpl)) out += *system;
  }
  for (const ChatMessage& m : messages) {
    absl::StrAppend(&out, kImStart, m.role, "\n", m.content, kImEnd, "\n");
  }
  if (add_generation_prompt) absl::StrAppend(&out, kImStart, "assistant\n");
  return out;
}

// Llama-3: no BOS here; the tokenizer adds it (add_bos), as llama.cpp does.
std::string RenderLlama3(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages) {
    absl::StrAppend(&out, "<|start_header_id|>", m.role, "<|end_header_id|>\n\n", Trim(m.content),
                    "<|eot_id|>");
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Zephyr: the template's eos_token is not visible here; "<|endoftext|>" is used, as
// llama.cpp does for this family.
std::string RenderZephyr(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  for (const ChatMessage& m : messages) {
    absl::StrAppend(&out, "<|", m.role, "|>\n", m.content, "<|endoftext|>\n");
  }
  if (add_generation_prompt) out += "<|assistant|>\n";
  return out;
}

// Gemma: "<start_of_turn>user\n...<end_of_turn>\n", the assistant's turns named "model",
// contents trimmed; no BOS here (the tokenizer adds it). There is no system turn: Gemma 3's
// template (it sets `first_user_prefix`) puts a first system message, + "\n\n", in front of
// the first turn; Gemma 2's refuses one. After that the turns must alternate: user at even
// places, anything but user at odd ones (the template's raise_exception), each named by its
// role (assistant -> model).
absl::StatusOr<std::string> RenderGemma(std::string_view tmpl,
                                        const std::vector<ChatMessage>& messages,
                                        bool add_generation_prompt) {
  size_t first = 0;
  std::string prefix;
  if (messages.front().role == "system") {
    if (tmpl.find("first_user_prefix") == std::string_view::npos) {
      return absl::InvalidArgumentError(
          "chat: this Gemma template has no system role (Gemma 3's puts it before the first "
          "user turn; this one refuses it)");
    }
    prefix = messages.front().content + "\n\n";
    first = 1;
  }
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if ((m.role == "user") != ((i - first) % 2 == 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat: the Gemma template needs turns alternating user / assistant (after an optional "
          "first system message); message ",
          i, " is '", m.role, "'"));
    }
    absl::StrAppend(&out, "<start_of_turn>", m.role == "assistant" ? "model" : m.role, "\n",
                    i == first ? prefix : "", Trim(m.content), "<end_of_turn>\n");
  }
  if (add_generation_prompt) out += "<start_of_turn>model\n";
  return out;
}

// Turns must alternate user / assistant (the [INST] templates' raise_exception).
absl::Status CheckAlternating(const std::vector<ChatMessage>& messages, size_t first,
                              const char* family) {
  for (size_t i = first; i < messages.size(); ++i) {
    if ((messages[i].role == "user") != ((i - first) % 2 == 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chat: the ", family, " template needs turns alternating user / assistant; message ", i,
          " is '", messages[i].role, "'"));
    }
  }
  return absl::OkStatus();
}

// Mistral v0.1 / v0.2 instruct: "[INST] user [/INST]assistant</s>", contents as given, no
// system role (the template raises), no generation prompt (the open [/INST] is one). The
// leading BOS is the tokenizer's (add_bos), as llama.cpp renders it.
absl::StatusOr<std::string> RenderMistral(const std::vector<ChatMessage>& messages) {
  if (messages.front().role == "system") {
    return absl::InvalidArgumentError(
        "chat: the Mistral [INST] template has no system role (only user and assistant)");
  }
  SPECNODE_RETURN_IF_ERROR(CheckAlternating(messages, 0, "Mistral"));
  std::string out;
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      absl::StrAppend(&out, "[INST] ", m.content, " [/INST]");
    } else {
      absl::StrAppend(&out, m.content, "</s>");
    }
  }
  return out;
}

// Llama 2 chat: "<s>[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] assistant </s>" per
// exchange, contents trimmed, the system message in the first user turn; every user turn
// after the first opens with "<s>" (the first BOS is the tokenizer's).
absl::StatusOr<std::string> RenderLlama2(const std::vector<ChatMessage>& messages) {
  size_t first = 0;
  std::string system;
  if (messages.front().role == "system") {
    system = messages.front().content;
    first = 1;
  }
  SPECNODE_RETURN_IF_ERROR(CheckAlternating(messages, first, "Llama 2"));
  std::string out;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      std::string content = m.content;
      if (i == first && first == 1) content = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content;
      absl::StrAppend(&out, i == first ? "" : "<s>", "[INST] ", Trim(content), " [/INST]");
    } else {
      absl::StrAppend(&out, " ", Trim(m.content), " </s>");
    }
  }
  return out;
}

// The built-in templates (BuiltinChatTemplate): each family's usual Jinja text for string
// contents; Jinja2 renders them as ApplyChatTemplate does (checked in chat_template_test.cc).
constexpr char kBuiltinChatMl[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' "
    "}}{% endif %}";
constexpr char kBuiltinLlama3[] =
    "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
constexpr char kBuiltinZephyr[] =
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '<|user|>\n' }}{% else "
    "%}{{ '<|' + message['role'] + '|>\n' }}{% endif %}{{ message['content'] + '<|endoftext|>\n' "
    "}}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}";
constexpr char kBuiltinGemma[] =
    "{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] "
    "+ '\n\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = "
    "\"\" -%}{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages "
    "-%}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}{{ raise_exception("
    "\"Conversation roles must alternate user/assistant/user/assistant/...\") }}{%- endif -%}{%- "
    "if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- else -%}{%- set role "
    "= message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix "
    "if loop.first else \"\") }}{{- message['content'] | trim }}{{- '<end_of_turn>\n' }}{%- "
    "endfor -%}{%- if add_generation_prompt -%}{{'<start_of_turn>model\n'}}{%- endif -%}";
// Mistral-7B-Instruct-v0.1's and Llama-2-chat's templates.
constexpr char kBuiltinMistral[] =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ "
    "'[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}";
constexpr char kBuiltinLlama2[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set "
    "system_message = false %}{% endif %}{% for message in loop_messages %}{% if "
    "(message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation "
    "roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == "
    "0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] "
    "%}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + "
    "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + "
    "eos_token }}{% endif %}{% endfor %}";

}  // namespace

absl::StatusOr<std::string> BuiltinChatTemplate(std::string_view name) {
  if (name == "chatml") return std::string(kBuiltinChatMl);
  if (name == "llama3") return std::string(kBuiltinLlama3);
  if (name == "zephyr") return std::string(kBuiltinZephyr);
  if (name == "gemma") return std::string(kBuiltinGemma);
  if (name == "mistral") return std::string(kBuiltinMistral);
  if (name == "llama2") return std::string(kBuiltinLlama2);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown chat template \"", std::string(name),
                   "\" (built in: chatml, llama3, zephyr, gemma, mistral, llama2)"));
}

absl::StatusOr<std::string> ApplyChatTemplate(const std::string& jinja_template,
                                              const std::vector<ChatMessage>& messages,
                                              bool add_generation_prompt) {
  if (messages.empty()) return absl::InvalidArgumentError("chat: empty conversation");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!IsKnownRole(messages[i].role)) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat: message ", i, " has unknown role '", messages[i].role,
                       "' (expected system, user, assistant or tool)"));
    }
  }
  if (jinja_template.empty()) {
    return absl::UnimplementedError(
        "chat: the model has no chat template (a base model); name one with --chat-template "
        "chatml|llama3|zephyr|gemma|mistral|llama2 (a serve config: model.chat_template)");
  }
  if (jinja_template.find(kImStart) != std::string::npos) {
    return RenderChatMl(jinja_template, messages, add_generation_prompt);
  }
  if (jinja_template.find("<|start_header_id|>") != std::string::npos) {
    return RenderLlama3(messages, add_generation_prompt);
  }
  if (jinja_template.find("<|user|>") != std::string::npos) {
    return RenderZephyr(messages, add_generation_prompt);
  }
  if (jinja_template.find("<start_of_turn>") != std::string::npos) {
    return RenderGemma(jinja_template, messages, add_generation_prompt);
  }
  // The [INST] families: Llama 2's (with <<SYS>>), else Mistral v0.1 / v0.2's exact form;
  // later Mistral templates ([INST] without the spaces, [SYSTEM_PROMPT], tools) are refused.
  if (jinja_template.find("[INST]") != std::string::npos) {
    if (jinja_template.find("<<SYS>>") != std::string::npos &&
        jinja_template.find("'[INST] ' + content.strip() + ' [/INST]'") != std::string::npos) {
      return RenderLlama2(messages);
    }
    if (jinja_template.find("'[INST] ' + message['content'] + ' [/INST]'") != std::string::npos &&
        jinja_template.find("message['content'] + eos_token") != std::string::npos) {
      return RenderMistral(messages);
    }
    return absl::UnimplementedError(
        "chat: this [INST] template is not one specnode reproduces (supported: Mistral "
        "v0.1/v0.2's and Llama 2's; name one with --chat-template mistral|llama2)");
  }
  return absl::UnimplementedError(
      "chat: unrecognised chat template (supported: ChatML, Llama-3, Zephyr, Gemma, Mistral, "
      "Llama 2)");
}

}  // namespace specnode

#include "model/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace specnode {
namespace {

// tokenizer.chat_template of SmolLM2-135M-Instruct (real newlines inside the literals).
const char kSmolLm2Template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

const char kSmolSystem[] =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n";

std::string Render(const std::string& tmpl, const std::vector<ChatMessage>& messages,
                   bool add_generation_prompt) {
  auto out = ApplyChatTemplate(tmpl, messages, add_generation_prompt);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

// Expected strings below were rendered with Jinja2 3.1 from the same templates.
TEST(ChatTemplateTest, SmolLm2InsertsDefaultSystem) {
  EXPECT_EQ(
      Render(kSmolLm2Template, {{"user", "Hello!"}}, true),
      std::string(kSmolSystem) + "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(Render(kSmolLm2Template, {{"user", "Hello!"}}, false),
            std::string(kSmolSystem) + "<|im_start|>user\nHello!<|im_end|>\n");
  EXPECT_EQ(Render(kSmolLm2Template, {{"user", "a"}, {"assistant", "b"}, {"tool", "c"}}, false),
            std::string(kSmolSystem) +
                "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
                "<|im_start|>tool\nc<|im_end|>\n");
}

TEST(ChatTemplateTest, SmolLm2KeepsExplicitSystem) {
  EXPECT_EQ(
      Render(kSmolLm2Template,
             {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}},
             true),
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
      "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, EscapedDefaultSystemLiteral) {
  // Qwen-style: "\n" written as an escape inside the Jinja literal, double quotes too.
  const std::string tmpl = R"({%- if messages[0]['role'] != 'system' %})"
                           R"({{- "<|im_start|>system\nYou are \"Q\".<|im_end|>\n" }})"
                           R"({%- endif %}{%- for message in messages %})"
                           R"({{- '<|im_start|>' + message.role + '\n' + message.content + )"
                           R"('<|im_end|>' + '\n' }}{%- endfor %})"
                           R"({%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }})"
                           R"({%- endif %})";
  EXPECT_EQ(Render(tmpl, {{"user", "x"}}, true),
            "<|im_start|>system\nYou are \"Q\".<|im_end|>\n<|im_start|>user\nx<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, PlainChatMlHasNoDefaultSystem) {
  const std::string tmpl =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\n' }}{% endif %}";
  EXPECT_EQ(Render(tmpl, {{"user", "don't"}}, true),
            "<|im_start|>user\ndon't<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Llama3) {
  const std::string tmpl =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ "
      "message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}{% if "
      "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
      "{% endif %}";
  EXPECT_EQ(Render(tmpl, {{"system", "S"}, {"user", "  hi \n"}}, true),
            "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, Zephyr) {
  const std::string tmpl = "{% if message['role'] == 'user' %}{{ '<|user|>\n' }}{% endif %}";
  EXPECT_EQ(Render(tmpl, {{"user", "hi"}}, true), "<|user|>\nhi<|endoftext|>\n<|assistant|>\n");
}

// Gemma 3 instruct's template (google/gemma-3-*-it) for string contents; expected strings
// rendered with Jinja2 3.1.6 from it (bos_token "": the tokenizer adds BOS).
const char kGemma3Template[] =
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- set first_user_prefix "
    "= messages[0]['content'] + '\n\n' -%}\n    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = "
    "messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if "
    "(message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception("
    "\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif "
    "-%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ "
    "'<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n    {{- "
    "message['content'] | trim }}\n    {{- '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if "
    "add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n";

TEST(ChatTemplateTest, Gemma3) {
  EXPECT_EQ(Render(kGemma3Template, {{"user", "Hello"}}, true),
            "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(Render(kGemma3Template,
                   {{"system", "Be brief."},
                    {"user", "  Hi there \n"},
                    {"assistant", "Hello! "},
                    {"user", "Bye"}},
                   true),
            "<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\n"
            "Hello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  // Jinja2 raises "Conversation roles must alternate ..." for two user turns in a row.
  auto twice = ApplyChatTemplate(kGemma3Template, {{"user", "a"}, {"user", "b"}}, true);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("alternating"), std::string::npos);
  // Gemma 2's template has no first_user_prefix and refuses a system message.
  const std::string gemma2 =
      "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role "
      "not supported') }}{% endif %}{{ '<start_of_turn>' + role + '\n' }}";
  EXPECT_EQ(Render(gemma2, {{"user", "x"}}, false), "<start_of_turn>user\nx<end_of_turn>\n");
  auto system = ApplyChatTemplate(gemma2, {{"system", "s"}, {"user", "x"}}, true);
  EXPECT_EQ(system.status().code(), absl::StatusCode::kInvalidArgument);
}

// The built-in templates (--chat-template NAME): expected strings rendered with Jinja2 3.1.6
// from BuiltinChatTemplate's own texts, so each text means what its family's renderer does.
TEST(ChatTemplateTest, BuiltinTemplatesRenderAsJinjaDoes) {
  const std::vector<ChatMessage> one = {{"user", " hi "}};
  const std::vector<ChatMessage> turns = {
      {"system", "S"}, {"user", "hi"}, {"assistant", "yo"}, {"user", "x"}};
  struct Case {
    const char* name;
    std::string one, turns;
  };
  const Case cases[] = {
      {"chatml", "<|im_start|>user\n hi <|im_end|>\n<|im_start|>assistant\n",
       "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
       "yo<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"},
      {"llama3",
       "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|"
       "end_header_id|>\n\n",
       "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_"
       "header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nyo<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|><|start_header_id|>assistant<|end_"
       "header_id|>\n\n"},
      {"zephyr", "<|user|>\n hi <|endoftext|>\n<|assistant|>\n",
       "<|system|>\nS<|endoftext|>\n<|user|>\nhi<|endoftext|>\n<|assistant|>\nyo<|endoftext|>\n"
       "<|user|>\nx<|endoftext|>\n<|assistant|>\n"},
      {"gemma", "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
       "<start_of_turn>user\nS\n\nhi<end_of_turn>\n<start_of_turn>model\nyo<end_of_turn>\n<start_"
       "of_turn>user\nx<end_of_turn>\n<start_of_turn>model\n"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::string> t = BuiltinChatTemplate(c.name);
    ASSERT_TRUE(t.ok()) << c.name << ": " << t.status();
    EXPECT_EQ(Render(*t, one, true), c.one) << c.name;
    EXPECT_EQ(Render(*t, turns, true), c.turns) << c.name;
  }
  auto unknown = BuiltinChatTemplate("alpaca");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("chatml, llama3, zephyr, gemma, mistral, llama2"),
            std::string::npos);
}

// The [INST] families. Expected strings rendered with Jinja2 3.1.6 from the built-in texts
// (Mistral-7B-Instruct-v0.1's and Llama-2-chat's templates), bos_token "<s>", eos_token
// "</s>", minus the leading "<s>" (the tokenizer adds BOS).
TEST(ChatTemplateTest, MistralAndLlama2RenderAsJinjaDoes) {
  const std::vector<ChatMessage> multi = {
      {"user", " What is 2+2? "}, {"assistant", " 4. "}, {"user", "And 3+3?"}};
  const std::vector<ChatMessage> sys = {
      {"system", "Be brief."}, {"user", "Hello"}, {"assistant", "Hi!"}, {"user", "Bye"}};
  auto mistral = BuiltinChatTemplate("mistral");
  auto llama2 = BuiltinChatTemplate("llama2");
  ASSERT_TRUE(mistral.ok() && llama2.ok());
  EXPECT_EQ(Render(*mistral, {{"user", "Hi there"}}, true), "[INST] Hi there [/INST]");
  EXPECT_EQ(Render(*mistral, multi, true),
            "[INST]  What is 2+2?  [/INST] 4. </s>[INST] And 3+3? [/INST]");
  // Mistral v0.1's template raises on a system message; so does the renderer.
  EXPECT_EQ(ApplyChatTemplate(*mistral, sys, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Render(*llama2, {{"user", "Hi there"}}, true), "[INST] Hi there [/INST]");
  EXPECT_EQ(Render(*llama2, multi, true),
            "[INST] What is 2+2? [/INST] 4. </s><s>[INST] And 3+3? [/INST]");
  EXPECT_EQ(Render(*llama2, sys, true),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHello [/INST] Hi! </s><s>[INST] Bye [/INST]");
  // Both need alternating turns.
  EXPECT_EQ(ApplyChatTemplate(*llama2, {{"user", "a"}, {"user", "b"}}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Another [INST] form (Mistral v0.3's, no spaces) is refused by name, not approximated.
  auto v3 =
      ApplyChatTemplate("{{ '[INST]' + message['content'] + '[/INST]' }}", {{"user", "a"}}, true);
  EXPECT_EQ(v3.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(v3.status().message().find("[INST]"), std::string::npos);
}

TEST(ChatTemplateTest, Errors) {
  auto empty = ApplyChatTemplate(kSmolLm2Template, {}, true);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto role = ApplyChatTemplate(kSmolLm2Template, {{"user", "a"}, {"wizard", "b"}}, true);
  EXPECT_EQ(role.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(role.status().message().find("wizard"), std::string::npos);
  auto unknown =
      ApplyChatTemplate("{{ messages[0].content }} ### Response:", {{"user", "a"}}, true);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnimplemented);
  auto none = ApplyChatTemplate("", {{"user", "a"}}, true);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnimplemented);
  // Unterminated literal: still renders, without a default system message.
  EXPECT_EQ(Render("{{ '<|im_start|>system\nX<|im_end|>", {{"user", "a"}}, false),
            "<|im_start|>user\na<|im_end|>\n");
}

}  // namespace
}  // namespace specnode

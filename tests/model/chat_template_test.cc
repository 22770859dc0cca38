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

TEST(ChatTemplateTest, Errors) {
  auto empty = ApplyChatTemplate(kSmolLm2Template, {}, true);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  auto role = ApplyChatTemplate(kSmolLm2Template, {{"user", "a"}, {"wizard", "b"}}, true);
  EXPECT_EQ(role.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(role.status().message().find("wizard"), std::string::npos);
  auto unknown = ApplyChatTemplate("{{ messages[0].content }} [INST]", {{"user", "a"}}, true);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kUnimplemented);
  auto none = ApplyChatTemplate("", {{"user", "a"}}, true);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnimplemented);
  // Unterminated literal: still renders, without a default system message.
  EXPECT_EQ(Render("{{ '<|im_start|>system\nX<|im_end|>", {{"user", "a"}}, false),
            "<|im_start|>user\na<|im_end|>\n");
}

}  // namespace
}  // namespace specnode

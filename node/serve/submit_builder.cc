#include "node/serve/submit_builder.h"

#include <string>
#include <utility>
#include <vector>

#include "coordinator/request_error.h"
#include "model/tokenizer/chat_template.h"

namespace specnode {

absl::StatusOr<GenerationRequest> BuildGenerationRequest(const SubmitMessage& m,
                                                         const Tokenizer& tok,
                                                         const DomainRouter& router) {
  auto bad = [](const absl::Status& s) {
    return RequestErrorStatus(RequestError::kBadRequest, std::string(s.message()));
  };
  std::vector<int32_t> ids;
  std::string routing_text;
  if (m.prompt.has_value()) {
    // Special tokens written in the text ("<|im_start|>", "<end_of_turn>") are those tokens,
    // as vLLM's and llama.cpp's servers read raw prompts: clients that apply a chat template
    // themselves send prompts like that.
    auto enc = tok.Encode(*m.prompt, /*parse_special=*/true);
    if (!enc.ok()) return bad(enc.status());
    ids = *std::move(enc);
    routing_text = *m.prompt;
  } else {
    auto rendered = ApplyChatTemplate(tok.spec().chat_template, m.messages, true);
    if (!rendered.ok()) return bad(rendered.status());
    auto enc = tok.Encode(*rendered, /*parse_special=*/true);
    if (!enc.ok()) return bad(enc.status());
    ids = *std::move(enc);
    for (const ChatMessage& cm : m.messages) {
      if (cm.role == "user") routing_text = cm.content;
    }
  }
  GenerationRequest g;
  g.prompt = std::move(ids);
  g.sampling = m.sampling;
  g.max_tokens = m.max_tokens;
  g.stop = m.stop;
  g.domain = m.domain.has_value() ? *m.domain : router.Classify("", routing_text);
  g.sla = m.sla;
  return g;
}

}  // namespace specnode

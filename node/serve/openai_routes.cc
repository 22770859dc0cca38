#include "node/serve/openai_routes.h"

#include <httplib.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <memory>
#include <mutex>
#include <random>

#include "absl/strings/str_format.h"
#include "coordinator/request_error.h"
#include "node/serve/http_server.h"
#include "node/serve/openai_api.h"
#include "node/serve/submit_builder.h"

namespace specnode {
namespace {

using Clock = std::chrono::steady_clock;

// How long a stream may stay silent (queued, or a long prefill) before a keep-alive SSE
// comment goes out: the write is what finds a client that has gone.
constexpr auto kKeepAlive = std::chrono::seconds(2);
constexpr auto kPoll = std::chrono::milliseconds(250);

// One request's events, from the scheduler thread (GenerationRequest::sink) to the HTTP
// thread answering it.
class Channel {
 public:
  void Push(GenerationEvent ev) {
    {
      std::lock_guard lock(mu_);
      events_.push_back(std::move(ev));
    }
    cv_.notify_all();
  }
  // The events so far, waiting up to `wait` for the first.
  std::deque<GenerationEvent> Take(std::chrono::milliseconds wait) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, wait, [&] { return !events_.empty(); });
    std::deque<GenerationEvent> out;
    out.swap(events_);
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenerationEvent> events_;
};

std::string NewId(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("%s%016x%08x", prefix, rng(), static_cast<uint32_t>(rng()));
}

void SetError(httplib::Response& res, const absl::Status& status) {
  SetHttpError(res, RequestErrorOf(status), std::string(status.message()));
}

std::string SseData(const std::string& json) { return "data: " + json + "\n\n"; }

// The connection a request came on, for a handler that must notice its client leaving
// before it has anything to write (a non-streaming request): found by its addresses
// (FindConnection, http_server.h), and checked again on every look.
class ClientConnection {
 public:
  explicit ClientConnection(const httplib::Request& req) : req_(req), fd_(FindConnection(req)) {}
  // True once the client has closed or reset the connection (false when it cannot tell).
  bool Gone() const {
    if (fd_ < 0) return false;
    if (!IsConnectionOf(fd_, req_)) return true;  // closed, and the number reused
    pollfd p{fd_, POLLRDHUP, 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
  }

 private:
  const httplib::Request& req_;  // outlives this (both the handler's)
  int fd_;
};

constexpr char kDrainCut[] =
    "the node is shutting down and cancelled the request before it finished";

// What a streamed request has sent so far.
struct StreamState {
  std::shared_ptr<Channel> channel;
  OpenAiRequest request;
  std::string id;
  int64_t created = 0;
  uint64_t handle = 0;
  bool first = true;
  bool finished = false;  // the terminal event was written
  Clock::time_point last_write = Clock::now();
};

// The SSE text for `events` (the terminal one sets s->finished); errors are counted.
std::string StreamText(StreamState* s, std::deque<GenerationEvent>& events, ErrorCounter* errors) {
  std::string out;
  const OpenAiRequest& r = s->request;
  for (GenerationEvent& ev : events) {
    switch (ev.kind) {
      case GenerationEvent::Kind::kTokens:
        if (ev.text.empty()) continue;
        out += SseData(OpenAiChunk(r, s->id, s->created, ev.text, s->first, std::nullopt));
        s->first = false;
        continue;
      case GenerationEvent::Kind::kDone:
        if (ev.finish == FinishKind::kCancelled) {
          if (errors != nullptr) errors->Add(RequestError::kShuttingDown);
          out += SseData(OpenAiError(RequestError::kShuttingDown, kDrainCut));
        } else {
          out += SseData(OpenAiChunk(r, s->id, s->created, "", s->first, ev.finish));
          if (r.include_usage) out += SseData(OpenAiUsageChunk(r, s->id, s->created, ev.stats));
        }
        break;
      case GenerationEvent::Kind::kError: {
        const RequestError code = RequestErrorOf(ev.error);
        if (errors != nullptr) errors->Add(code);
        out += SseData(OpenAiError(code, std::string(ev.error.message())));
        break;
      }
    }
    out += "data: [DONE]\n\n";
    s->finished = true;
    break;
  }
  return out;
}

}  // namespace

OpenAiService::OpenAiService(OpenAiServiceOptions options, Scheduler* scheduler,
                             const Tokenizer* tokenizer, const DomainRouter* router,
                             ErrorCounter* errors)
    : options_(std::move(options)),
      scheduler_(scheduler),
      tokenizer_(tokenizer),
      router_(router),
      errors_(errors),
      created_(static_cast<int64_t>(std::time(nullptr))) {}

void OpenAiService::Register(HttpRouter& router) {
  router.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(OpenAiModelList(options_.model_names, created_, options_.max_model_len),
                    "application/json");
  });
  auto route = [this](OpenAiEndpoint endpoint) {
    return [this, endpoint](const httplib::Request& req, const std::string& body,
                            httplib::Response& res) {
      absl::StatusOr<OpenAiRequest> r =
          ParseOpenAiRequest(endpoint, body, options_.limits, options_.model_names);
      if (!r.ok()) return SetError(res, r.status());
      absl::StatusOr<GenerationRequest> g =
          BuildGenerationRequest(r->submit, *tokenizer_, *router_);
      if (!g.ok()) return SetError(res, g.status());
      if (r->max_tokens_fill) {
        const int64_t room = options_.max_model_len - static_cast<int64_t>(g->prompt.size());
        g->max_tokens = std::max<int64_t>(1, std::min(options_.limits.max_tokens, room));
      }
      auto channel = std::make_shared<Channel>();
      g->sink = [channel](GenerationEvent ev) { channel->Push(std::move(ev)); };
      absl::StatusOr<Scheduler::Ticket> ticket = scheduler_->Submit(*std::move(g));
      if (!ticket.ok()) return SetError(res, ticket.status());
      const bool chat = endpoint == OpenAiEndpoint::kChatCompletions;
      const std::string id = NewId(chat ? "chatcmpl-" : "cmpl-");
      const int64_t created = static_cast<int64_t>(std::time(nullptr));
      res.set_header("X-Request-Id", id);
      if (!r->submit.stream) {
        // Every request gets exactly one terminal event (Scheduler::Stop ends the rest). A
        // client that leaves first has its request cancelled (its terminal event follows).
        const ClientConnection client(req);
        bool cancelled = false;
        while (true) {
          if (!cancelled && client.Gone()) {
            (void)scheduler_->Cancel(ticket->handle);
            cancelled = true;
          }
          for (GenerationEvent& ev : channel->Take(kPoll)) {
            if (ev.kind == GenerationEvent::Kind::kTokens) continue;
            if (ev.kind == GenerationEvent::Kind::kError) return SetError(res, ev.error);
            if (ev.finish == FinishKind::kCancelled) {
              return SetHttpError(res, RequestError::kShuttingDown, kDrainCut);
            }
            res.set_content(OpenAiResponse(*r, id, created, ev.text, ev.finish, ev.stats),
                            "application/json");
            return;
          }
        }
      }
      auto state = std::make_shared<StreamState>();
      state->channel = channel;
      state->request = *std::move(r);
      state->id = id;
      state->created = created;
      state->handle = ticket->handle;
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");  // proxies: pass events through at once
      Scheduler* scheduler = scheduler_;
      ErrorCounter* errors = errors_;
      res.set_chunked_content_provider(
          "text/event-stream",
          [state, errors](size_t, httplib::DataSink& sink) {
            std::deque<GenerationEvent> events = state->channel->Take(kPoll);
            std::string out = StreamText(state.get(), events, errors);
            const auto now = Clock::now();
            if (out.empty() && now - state->last_write >= kKeepAlive) out = ": keep-alive\n\n";
            if (!out.empty()) {
              if (!sink.write(out.data(), out.size())) return false;  // the client left
              state->last_write = now;
            }
            if (state->finished) sink.done();
            return true;
          },
          // Called when the response ends; a stream that ended before its terminal event
          // (a failed write, the server stopping) cancels the request, freeing its KV.
          [state, scheduler](bool) {
            if (!state->finished) scheduler->Cancel(state->handle);
          });
    };
  };
  router.Post("/v1/chat/completions", route(OpenAiEndpoint::kChatCompletions));
  router.Post("/v1/completions", route(OpenAiEndpoint::kCompletions));
}

}  // namespace specnode

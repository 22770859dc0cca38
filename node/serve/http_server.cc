#include "node/serve/http_server.h"

#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "node/serve/openai_api.h"
#include "node/serve/openai_routes.h"

namespace specnode {
namespace {

constexpr auto kRenderWait = std::chrono::milliseconds(1000);

// Constant-time comparison of the Authorization header with the expected one (a timing
// difference would tell an attacker how much of a guessed key was right).
bool SameSecret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

RequestError CodeOfStatus(int status) {
  switch (status) {
    case 401:
      return RequestError::kUnauthorized;
    case 404:
    case 405:
      return RequestError::kNotFound;
    case 413:
      return RequestError::kFrameTooLarge;
    case 429:
      return RequestError::kOverloaded;
    case 503:
      return RequestError::kShuttingDown;
    default:
      return status >= 500 ? RequestError::kInternal : RequestError::kBadRequest;
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options) {
  // A client that closes its connection mid-response must not kill the node: httplib writes
  // with send() without MSG_NOSIGNAL, so the write's SIGPIPE is ignored process-wide (the
  // write then fails with EPIPE, which ends that response).
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->options_ = std::move(options);
  s->server_ = std::make_unique<httplib::Server>();
  const int threads = s->options_.threads;
  s->server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s->server_->set_payload_max_length(s->options_.max_body_bytes);
  s->server_->set_keep_alive_max_count(1000);
  s->server_->set_read_timeout(5, 0);
  s->server_->set_write_timeout(10, 0);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second node would
  // bind the same port and silently share its traffic.
  s->server_->set_socket_options([](int sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s->Routes();
  const HttpAddress& a = s->options_.address;
  // Port 0: the kernel picks one (tests), read back from the socket.
  s->port_ = a.port == 0 ? s->server_->bind_to_any_port(a.host)
                         : (s->server_->bind_to_port(a.host, a.port) ? a.port : -1);
  if (s->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot bind the ", s->options_.name, " ", a.text(),
                                               ": ", std::strerror(errno), " (address in use?)"));
  }
  httplib::Server* server = s->server_.get();
  s->thread_ = std::thread([server] { server->listen_after_bind(); });
  // httplib's stop() does nothing until the accept loop runs (is_running): wait for it, so
  // that a server destroyed at once still stops.
  while (!server->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return s;
}

HttpServer::~HttpServer() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpServer::Routes() {
  httplib::Server& svr = *server_;
  HttpServerOptions& o = options_;
  ErrorCounter* errors = o.errors;
  // Every error answer (ours and httplib's own: 404, 405, 413, 400 for a malformed request)
  // becomes OpenAI-style JSON with a code from the one table, counted once.
  svr.set_error_handler([errors](const httplib::Request&, httplib::Response& res) {
    // A route's error names its code (openai_routes.cc); httplib's own errors by status.
    RequestError code = CodeOfStatus(res.status);
    if (res.has_header("X-Specnode-Error-Code")) {
      (void)ParseWireCode(res.get_header_value("X-Specnode-Error-Code"), &code);
    }
    if (errors != nullptr) errors->Add(code);
    if (!res.body.empty()) return;
    std::string message = res.status == 404   ? "no such route"
                          : res.status == 405 ? "method not allowed on this route"
                          : res.status == 413 ? "request body too large"
                                              : "bad request";
    res.set_content(OpenAiError(code, message), "application/json");
  });
  const std::string bearer = o.api_key.empty() ? "" : "Bearer " + o.api_key;
  svr.set_pre_routing_handler([bearer](const httplib::Request& req, httplib::Response& res) {
    if (bearer.empty() || !absl::StartsWith(req.path, "/v1")) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    if (SameSecret(req.get_header_value("Authorization"), bearer)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.status = 401;
    res.set_header("WWW-Authenticate", "Bearer");
    res.set_header("X-Specnode-Error-Code", "unauthorized");
    res.set_content(OpenAiError(RequestError::kUnauthorized,
                                "missing or wrong API key (Authorization: Bearer ...)"),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  });
  MetricsExchange* metrics = o.metrics;
  svr.Get("/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics != nullptr ? metrics->Fetch(kRenderWait) : std::string(),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  std::function<HealthReply()> health = o.health;
  svr.Get("/health", [health](const httplib::Request&, httplib::Response& res) {
    const HealthReply h = health ? health() : HealthReply{200, "{\"status\":\"ok\"}"};
    res.status = h.status;
    res.set_content(h.json, "application/json");
  });
  if (o.api != nullptr) o.api->Register(svr);
}

}  // namespace specnode

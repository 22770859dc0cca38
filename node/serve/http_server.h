// The node's HTTP listener, on cpp-httplib (Debian's libcpp-httplib): GET /metrics (the
// Prometheus text, through a MetricsExchange) and GET /health on every listener, and, when
// given an OpenAiService (openai_routes.h), the OpenAI-compatible API under /v1. One
// server serves serve.http_bind (everything) and, separately, serve.metrics_bind (metrics
// and health only, for a scrape port kept apart from traffic).
//
// Limits: request bodies above max_body_bytes get 413 `frame_too_large` before they are
// read; headers above 8 KiB 431 (httplib's limit); a client silent for 5 s while sending a
// request is dropped. Errors, including routing ones (404 `not_found`, 405), are
// OpenAI-style JSON with the wire code of the one error table (request_error.h), and are
// counted in `errors`.
//
// Auth: with a non-empty api_key every /v1 route needs `Authorization: Bearer <api_key>`
// (401 `unauthorized` otherwise, compared in constant time); /metrics and /health stay
// open, as for vLLM's --api-key.
//
// Threads: `threads` handler threads (a streaming response holds one for its length), plus
// the accept thread. The destructor stops accepting and joins every thread: a handler
// waiting for a request's events returns once the scheduler ends the request (Scheduler::
// Stop ends them all), so stop the scheduler first.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "node/serve/error_counter.h"
#include "node/serve/http_address.h"
#include "node/serve/metrics_http.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace specnode {

class OpenAiService;

// GET /health's answer: 200 while serving, 503 while draining or after a lost target (so a
// load balancer stops sending), with a JSON body.
struct HealthReply {
  int status = 200;
  std::string json;
};

struct HttpServerOptions {
  HttpAddress address;
  std::string name = "HTTP endpoint";  // in errors: "cannot bind the <name> HOST:PORT"
  int threads = 32;
  size_t max_body_bytes = 4 << 20;
  std::string api_key;                  // "" = no auth
  MetricsExchange* metrics = nullptr;   // GET /metrics; borrowed, outlives the server
  std::function<HealthReply()> health;  // GET /health (any thread); empty: 200 {"status":"ok"}
  OpenAiService* api = nullptr;         // the /v1 routes; null: metrics and health only
  ErrorCounter* errors = nullptr;       // error replies, by code; may be null
};

class HttpServer {
 public:
  // Binds and starts serving. Unavailable naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  const HttpServerOptions& options() const { return options_; }

 private:
  HttpServer() = default;
  void Routes();

  HttpServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace specnode

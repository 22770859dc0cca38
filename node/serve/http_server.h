// The node's HTTP listener, on cpp-httplib (Debian's libcpp-httplib): GET /metrics (the
// Prometheus text, through a MetricsExchange) and GET /health on every listener, and, when
// given routes (OpenAiService::Register, openai_routes.h), the OpenAI-compatible API under
// /v1. One server serves serve.http_bind (everything) and, separately, serve.metrics_bind
// (metrics and health only, for a scrape port kept apart from traffic).
//
// Bodies. A Content-Length over max_body_bytes is refused with 413 `frame_too_large` as
// soon as the headers are in, on any route, the body unread; a method that takes a body
// (POST, PUT, PATCH, DELETE) with neither a Content-Length nor chunks gets 411
// `bad_request` at once (httplib would read to the end of the connection), and the
// connection closes. A POST route's body is read by
// the listener (HttpRouter::Post), counted after any Content-Encoding (gzip, deflate) is
// undone and whatever the Content-Type: a chunked or compressed body gets the 413 once the
// limit is passed, and the rest of it is read and dropped (up to kMaxDrainBytes) so that
// the connection can carry the next request. A longer one, and any body left unread (a
// refusal before the body), closes the connection after the answer (CloseAfterUnread), so
// that leftover body bytes are never taken for a request. A body for any other route is
// refused unread when httplib could not bound it (chunked, compressed), and on a method
// httplib reads no body for (GET: it would parse that body as the next request).
//
// Other limits: the request line and headers up to 8 KiB each (httplib's; beyond: 414 / 400
// `bad_request`); a client silent for 5 s while sending is dropped. Every error, httplib's
// own included (404 `not_found`; 405 `not_found` with Allow on a known path; 400, 414, 416
// for a request it could not read), is OpenAI-style JSON with the wire code of the one error
// table (request_error.h) in the body and the X-Specnode-Error-Code header, counted in
// `errors`. After httplib's refusal of a request it could not read, where that request ends
// is unknown: the connection closes.
//
// Auth: with a non-empty api_key every /v1 route needs `Authorization: Bearer <api_key>`
// (401 `unauthorized` otherwise, compared in constant time); /metrics and /health stay
// open, as for vLLM's --api-key.
//
// Threads (http_handler_pool.h): `threads` handler threads (a streaming response holds one
// for its length) and kOverflowThreads more that answer while those are all held: health,
// metrics and GET routes as usual, POST routes with 429 `overloaded` — each closing its
// connection after the answer. Plus the accept thread. The destructor stops accepting and
// joins every thread: a handler waiting for a request's events returns once the scheduler
// ends the request (Scheduler::Stop ends them all), so stop the scheduler first; one closing
// a connection after a refusal (CloseAfterUnread) holds its thread up to kLingerTime.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "coordinator/request_error.h"
#include "node/serve/error_counter.h"
#include "node/serve/http_address.h"
#include "node/serve/metrics_http.h"

namespace httplib {
class Server;
struct Request;
struct Response;
class ContentReader;
}  // namespace httplib

namespace specnode {

class HttpServer;

// An error answer: the status of `code` in the one table (request_error.h), the code in the
// X-Specnode-Error-Code header (what the listener counts it under) and an OpenAI-style body.
void SetHttpError(httplib::Response& res, RequestError code, const std::string& message);
// Makes the listener close the connection once `res` is written (Connection: close). A
// streaming response is left as it is.
void CloseAfter(httplib::Response& res);
// CloseAfter for a refusal that left (some of) `req`'s body unread. After the answer the
// write side is shut (the client reads the answer, then the end) and what the client still
// sends is read and dropped, never parsed, until it stops for kLingerIdle, closes, or
// kLingerTime or kMaxDrainBytes pass (a lingering close, as nginx's): a client still sending
// its body reads the answer instead of a reset.
void CloseAfterUnread(const httplib::Request& req, httplib::Response& res);

// The descriptor of the connection `req` came on: httplib hands handlers no socket, so it
// is found among the process's descriptors by the connection's two addresses; -1 when none
// matches (or `req` has no addresses: a request line httplib could not parse).
int FindConnection(const httplib::Request& req);
// True while `fd` is the connection `req` came on (a descriptor number is reused once
// closed).
bool IsConnectionOf(int fd, const httplib::Request& req);

// The routes a service adds to the listener (OpenAiService::Register): handlers run on the
// listener's threads.
class HttpRouter {
 public:
  using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;
  // `body`: the whole request body, at most max_body_bytes, decoded.
  using BodyHandler =
      std::function<void(const httplib::Request&, const std::string& body, httplib::Response&)>;
  explicit HttpRouter(HttpServer* server) : server_(server) {}
  void Get(const std::string& path, Handler handler);
  // The listener reads the body (see Bodies above), then checks the API key, then, on an
  // overflow thread, answers 429; the handler sees only requests that passed.
  void Post(const std::string& path, BodyHandler handler);

 private:
  HttpServer* server_;
};

// GET /health's answer: 200 while serving, 503 while draining or after a lost target (so a
// load balancer stops sending), with a JSON body.
struct HealthReply {
  int status = 200;
  std::string json;
  // The code a non-200 answer is counted and headed under (X-Specnode-Error-Code); unset:
  // the status's (503: shutting_down).
  std::optional<RequestError> code;
};

struct HttpServerOptions {
  HttpAddress address;
  std::string name = "HTTP endpoint";  // in errors: "cannot bind the <name> HOST:PORT"
  int threads = 512;
  size_t max_body_bytes = 4 << 20;
  std::string api_key;                  // "" = no auth
  MetricsExchange* metrics = nullptr;   // GET /metrics; borrowed, outlives the server
  std::function<HealthReply()> health;  // GET /health (any thread); empty: 200 {"status":"ok"}
  // Adds the service routes (the OpenAI API: OpenAiService::Register); empty: metrics and
  // health only. Called once, before the listener starts.
  std::function<void(HttpRouter&)> routes;
  ErrorCounter* errors = nullptr;  // error replies, by code; may be null
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

  static constexpr size_t kOverflowThreads = 4;
  // The most of an oversized body read (and dropped) to keep its connection usable, or
  // after a refusal that closes it (CloseAfterUnread).
  static constexpr size_t kMaxDrainBytes = size_t{64} << 20;
  // CloseAfterUnread's bounds: the longest silence it waits through, its whole time.
  static constexpr std::chrono::milliseconds kLingerIdle{1000};
  static constexpr std::chrono::milliseconds kLingerTime{5000};

 private:
  friend class HttpRouter;
  HttpServer() = default;
  void Routes();
  bool Authorized(const httplib::Request& req) const;
  // The 401 answer (closing the connection when `unread_body`).
  void Unauthorized(const httplib::Request& req, httplib::Response& res, bool unread_body) const;
  // The checks before any body is read (httplib's pre-routing handler): true when `res` is
  // a refusal.
  bool RefusedBeforeTheBody(const httplib::Request& req, httplib::Response& res) const;
  // The error handler: every error answer, ours and httplib's own.
  void FinishError(const httplib::Request& req, httplib::Response& res) const;

  HttpServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::map<std::string, std::string> allowed_;  // path -> its method (405 for the others)
};

}  // namespace specnode

#include "node/serve/http_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/request_error.h"
#include "node/serve/http_handler_pool.h"
#include "node/serve/openai_api.h"

namespace specnode {
namespace {

constexpr auto kRenderWait = std::chrono::milliseconds(1000);
constexpr char kErrorHeader[] = "X-Specnode-Error-Code";

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

bool Chunked(const httplib::Request& req) {
  return absl::StrContains(absl::AsciiStrToLower(req.get_header_value("Transfer-Encoding")),
                           "chunked");
}

// A body httplib would read into memory without a bound of its own: chunked (no length up
// front) or compressed (the length is the compressed one).
bool Unbounded(const httplib::Request& req) {
  const std::string encoding = req.get_header_value("Content-Encoding");
  return Chunked(req) || (!encoding.empty() && !absl::EqualsIgnoreCase(encoding, "identity"));
}

// The methods httplib reads a body for (any other leaves it to be parsed as a request).
bool ReadsBody(const std::string& method) {
  return method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE" ||
         method == "PRI";
}

bool HasBody(const httplib::Request& req) {
  return Chunked(req) || req.get_header_value<uint64_t>("Content-Length") > 0;
}

// A Content-Length over `max` (a chunked body's is ignored, as httplib ignores it).
bool LengthOver(const httplib::Request& req, size_t max) {
  return !Chunked(req) && req.has_header("Content-Length") &&
         req.get_header_value<uint64_t>("Content-Length") > max;
}

void SetTooLarge(httplib::Response& res, size_t max) {
  SetHttpError(
      res, RequestError::kFrameTooLarge,
      absl::StrCat("the request body is over ", max, " bytes (serve.http_max_body_bytes)"));
}

// The numeric address and port of a socket address (IPv4 or IPv6), as httplib writes them.
bool AddressOf(const sockaddr_storage& a, std::string* host, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    *port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    *port = ntohs(v6->sin6_port);
  } else {
    return false;
  }
  *host = text;
  return true;
}

// After the answer to a refusal: the write side shut, then what the client sends read and
// dropped within CloseAfterUnread's bounds (http_server.h).
void Linger(int fd) {
  ::shutdown(fd, SHUT_WR);
  const auto end = std::chrono::steady_clock::now() + HttpServer::kLingerTime;
  size_t dropped = 0;
  char buf[16384];
  while (dropped < HttpServer::kMaxDrainBytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::min(left, HttpServer::kLingerIdle).count())) <= 0) {
      break;  // silent (or an error): the client has what it needs
    }
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) break;  // the client closed
    dropped += static_cast<size_t>(n);
  }
}

// Makes `res` close its connection, calling `after` once the answer is written.
void CloseWith(httplib::Response& res, std::function<void()> after) {
  if (res.content_provider_) return;
  // httplib ends a connection after a response only when the request asked for it or a
  // write fails: the body goes through a content provider that writes all of it and then
  // reports a failure.
  auto body = std::make_shared<std::string>(std::move(res.body));
  res.body.clear();
  if (body->empty()) *body = "\n";
  const std::string type = res.has_header("Content-Type") ? res.get_header_value("Content-Type")
                                                          : std::string("text/plain");
  res.headers.erase("Content-Type");
  res.set_header("Connection", "close");
  res.set_content_provider(
      body->size(), type,
      [body, after = std::move(after)](size_t offset, size_t length, httplib::DataSink& sink) {
        if (sink.write(body->data() + offset, length) && after) after();
        return false;
      });
}

struct BodyRead {
  std::string bytes;
  bool complete = false;   // read to its end (and kept, unless too_large)
  bool too_large = false;  // more than the limit after decoding
};

// Reads a body through httplib's reader, keeping up to `max` bytes; the rest of a larger
// one is read and dropped (so that the connection stays in step) up to kMaxDrainBytes, where
// reading stops (complete = false: the connection must close).
BodyRead ReadBody(const httplib::ContentReader& reader, size_t max) {
  BodyRead b;
  size_t seen = 0;
  b.complete = reader([&](const char* data, size_t n) {
    seen += n;
    if (seen > max) {
      if (!b.too_large) std::string().swap(b.bytes);
      b.too_large = true;
      return seen <= HttpServer::kMaxDrainBytes;
    }
    b.bytes.append(data, n);
    return true;
  });
  return b;
}

}  // namespace

void SetHttpError(httplib::Response& res, RequestError code, const std::string& message) {
  res.status = RequestErrorInfoOf(code).http;
  // The error handler (below) counts the reply under this code.
  res.set_header("X-Specnode-Error-Code", std::string(WireCode(code)));
  res.set_content(OpenAiError(code, message), "application/json");
}

void CloseAfter(httplib::Response& res) { CloseWith(res, nullptr); }

void CloseAfterUnread(const httplib::Request& req, httplib::Response& res) {
  // The descriptor is looked up once the answer is out, by the addresses (kept: `req` does
  // not outlive the handler).
  auto who = std::make_shared<httplib::Request>();
  who->remote_addr = req.remote_addr;
  who->remote_port = req.remote_port;
  who->local_port = req.local_port;
  CloseWith(res, [who] {
    if (const int fd = FindConnection(*who); fd >= 0) Linger(fd);
  });
}

int FindConnection(const httplib::Request& req) {
  if (req.remote_port < 0 || req.local_port < 0) return -1;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    if (fd > 2 && IsConnectionOf(fd, req)) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

bool IsConnectionOf(int fd, const httplib::Request& req) {
  sockaddr_storage peer{}, self{};
  socklen_t pl = sizeof(peer), sl = sizeof(self);
  std::string remote, local;
  int remote_port = 0, local_port = 0;
  return getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) == 0 &&
         getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sl) == 0 &&
         AddressOf(peer, &remote, &remote_port) && AddressOf(self, &local, &local_port) &&
         remote_port == req.remote_port && local_port == req.local_port &&
         remote == req.remote_addr;
}

void HttpRouter::Get(const std::string& path, Handler handler) {
  HttpServer* s = server_;
  s->allowed_[path] = "GET";
  // The key of /v1 routes is checked before routing (HttpServer::Routes).
  s->server_->Get(path, [handler](const httplib::Request& req, httplib::Response& res) {
    handler(req, res);
    if (HttpHandlerPool::OnOverflowThread()) CloseAfter(res);
  });
}

void HttpRouter::Post(const std::string& path, BodyHandler handler) {
  HttpServer* s = server_;
  s->allowed_[path] = "POST";
  s->server_->Post(path, [s, handler](const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& reader) {
    const size_t max = s->options_.max_body_bytes;
    if (req.is_multipart_form_data()) {  // httplib would parse it as form fields
      SetHttpError(res, RequestError::kBadRequest,
                   "the body is multipart/form-data; send a JSON object");
      return CloseAfterUnread(req, res);
    }
    // (A Content-Length over the limit was refused before routing: RefusedBeforeTheBody.)
    BodyRead b = ReadBody(reader, max);
    if (b.too_large) {
      SetTooLarge(res, max);
      if (!b.complete) CloseAfterUnread(req, res);
      return;
    }
    if (!b.complete) {
      SetHttpError(res, RequestError::kBadRequest,
                   res.status == 415 ? absl::StrCat("Content-Encoding '",
                                                    req.get_header_value("Content-Encoding"),
                                                    "' is not supported (gzip, deflate)")
                                     : std::string("the request body could not be read"));
      return CloseAfterUnread(req, res);
    }
    if (!s->Authorized(req)) return s->Unauthorized(req, res, false);
    if (HttpHandlerPool::OnOverflowThread()) {
      SetHttpError(res, RequestError::kOverloaded,
                   absl::StrCat("all ", s->options_.threads,
                                " HTTP handler threads are busy (serve.http_threads); retry"));
      res.set_header("Retry-After", "1");
      return CloseAfter(res);
    }
    handler(req, b.bytes, res);
  });
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options) {
  // A client that closes its connection mid-response must not kill the node: httplib writes
  // with send() without MSG_NOSIGNAL, so the write's SIGPIPE is ignored process-wide (the
  // write then fails with EPIPE, which ends that response).
  signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<HttpServer> s(new HttpServer());
  s->options_ = std::move(options);
  s->server_ = std::make_unique<httplib::Server>();
  const size_t threads = static_cast<size_t>(std::max(1, s->options_.threads));
  s->server_->new_task_queue = [threads] { return new HttpHandlerPool(threads, kOverflowThreads); };
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

bool HttpServer::Authorized(const httplib::Request& req) const {
  return options_.api_key.empty() ||
         SameSecret(req.get_header_value("Authorization"), "Bearer " + options_.api_key);
}

void HttpServer::Unauthorized(const httplib::Request& req, httplib::Response& res,
                              bool unread_body) const {
  SetHttpError(res, RequestError::kUnauthorized,
               "missing or wrong API key (Authorization: Bearer ...)");
  res.set_header("WWW-Authenticate", "Bearer");
  if (unread_body) CloseAfterUnread(req, res);
}

bool HttpServer::RefusedBeforeTheBody(const httplib::Request& req, httplib::Response& res) const {
  // httplib would read (and drop) a body over the limit to its end before answering, and
  // keep the connection: refused at once instead, and closed.
  if (LengthOver(req, options_.max_body_bytes)) {
    SetTooLarge(res, options_.max_body_bytes);
    CloseAfterUnread(req, res);
    return true;
  }
  // Neither a length nor chunks: httplib would read to the end of the connection (the
  // client waits for an answer meanwhile, until the read timeout). 411, as nginx answers.
  if (ReadsBody(req.method) && !Chunked(req) && !req.has_header("Content-Length")) {
    SetHttpError(res, RequestError::kBadRequest,
                 absl::StrCat("a ", req.method,
                              " request needs a Content-Length (or Transfer-Encoding: chunked)"));
    res.status = 411;  // Length Required
    CloseAfterUnread(req, res);
    return true;
  }
  // A POST route reads its own body (HttpRouter::Post: bounded, then the key).
  if (auto it = allowed_.find(req.path);
      req.method == "POST" && it != allowed_.end() && it->second == "POST") {
    return false;
  }
  // Any other /v1 request needs the key; a refusal here leaves a body unread.
  if (absl::StartsWith(req.path, "/v1") && !Authorized(req)) {
    Unauthorized(req, res, HasBody(req));
    return true;
  }
  if (Unbounded(req)) {
    SetHttpError(res, RequestError::kBadRequest,
                 "a chunked or compressed body is accepted by the POST routes only");
  } else if (!ReadsBody(req.method) && HasBody(req)) {
    SetHttpError(res, RequestError::kBadRequest,
                 absl::StrCat("a ", req.method, " request takes no body"));
  } else {
    return false;
  }
  CloseAfterUnread(req, res);
  return true;
}

void HttpServer::FinishError(const httplib::Request& req, httplib::Response& res) const {
  // A known path asked with another method: 405 naming the one it takes.
  if (auto it = allowed_.find(req.path);
      res.status == 404 && it != allowed_.end() && it->second != req.method) {
    res.status = 405;
    res.set_header("Allow", it->second);
  }
  // A route's error names its code (SetHttpError); httplib's own errors are coded by status.
  const bool ours = res.has_header(kErrorHeader);
  RequestError code = CodeOfStatus(res.status);
  if (ours) {
    (void)ParseWireCode(res.get_header_value(kErrorHeader), &code);
  } else {
    res.set_header(kErrorHeader, std::string(WireCode(code)));
  }
  if (options_.errors != nullptr) options_.errors->Add(code);
  if (res.body.empty() && !res.content_provider_) {
    const std::string message = res.status == 404   ? "no such route"
                                : res.status == 405 ? "method not allowed on this route"
                                : res.status == 413 ? "request body too large"
                                : res.status == 414 ? "the request line is too long"
                                                    : "bad request";
    res.set_content(OpenAiError(code, message), "application/json");
  }
  // httplib's other refusals (400, 414, 416, ...) are of a request it could not read or
  // route: where its bytes end is unknown, so the connection closes. (A 404 or 405 comes
  // after its body was read, or refused unread before routing.)
  if (!ours && res.status != 404 && res.status != 405) CloseAfterUnread(req, res);
}

void HttpServer::Routes() {
  httplib::Server& svr = *server_;
  // Every error answer (ours and httplib's own: 404, 413, 400 for a malformed request)
  // becomes OpenAI-style JSON with a code from the one table, counted once.
  svr.set_error_handler(
      [this](const httplib::Request& req, httplib::Response& res) { FinishError(req, res); });
  // Called once the headers are in, before any body is read.
  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return RefusedBeforeTheBody(req, res) ? httplib::Server::HandlerResponse::Handled
                                          : httplib::Server::HandlerResponse::Unhandled;
  });
  HttpRouter router(this);
  MetricsExchange* metrics = options_.metrics;
  router.Get("/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics != nullptr ? metrics->Fetch(kRenderWait) : std::string(),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  std::function<HealthReply()> health = options_.health;
  router.Get("/health", [health](const httplib::Request&, httplib::Response& res) {
    const HealthReply h = health ? health() : HealthReply{200, "{\"status\":\"ok\"}", std::nullopt};
    res.status = h.status;
    if (h.code.has_value()) res.set_header(kErrorHeader, std::string(WireCode(*h.code)));
    res.set_content(h.json, "application/json");
  });
  if (options_.routes) options_.routes(router);
}

}  // namespace specnode

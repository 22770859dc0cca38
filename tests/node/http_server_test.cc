// The node's HTTP listener (node/serve/http_server.h) over a real loopback socket: what a
// scraper gets, health, auth, limits, errors as OpenAI-style JSON with the table's codes,
// the render hand-over, and start-up errors. The OpenAI routes themselves are tested end to
// end with the openai SDK (tests/serve/test_openai_http.py).
#include "node/serve/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specnode {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Sends `request` to 127.0.0.1:port and returns everything the server answers (until it
// closes, or 10 s pass).
std::string Exchange(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return "connect failed";
  }
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  // (No shutdown(SHUT_WR): httplib takes a half-closed connection for a gone client.)
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// A renderer thread standing in for the front end's socket loop.
class Renderer {
 public:
  explicit Renderer(MetricsExchange* ex)
      : thread_([this, ex] {
          while (!stop_) {
            if (ex->Wanted())
              ex->Publish("specnode_requests_total{outcome=\"completed\"} " +
                          std::to_string(++renders_) + "\n");
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
        }) {}
  ~Renderer() {
    stop_ = true;
    thread_.join();
  }
  int renders() const { return renders_; }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> renders_{0};
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<HttpServer>> StartOn0(MetricsExchange* ex, ErrorCounter* errors,
                                                     std::string api_key = "",
                                                     size_t max_body = 1 << 20) {
  HttpServerOptions o;
  o.address = {"127.0.0.1", 0};
  o.threads = 4;
  o.metrics = ex;
  o.errors = errors;
  o.api_key = std::move(api_key);
  o.max_body_bytes = max_body;
  return HttpServer::Start(o);
}

TEST(HttpServerTest, ServesFreshMetricsAndHealth) {
  MetricsExchange ex;
  Renderer renderer(&ex);
  ErrorCounter errors;
  auto server = StartOn0(&ex, &errors);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  const std::string first =
      Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(first, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(first, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(first, HasSubstr("\r\n\r\nspecnode_requests_total{outcome=\"completed\"} 1\n"));
  // Every scrape asks for a new render.
  const std::string second = Exchange(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
  EXPECT_THAT(second, HasSubstr("} 2\n"));
  EXPECT_EQ(renderer.renders(), 2);
  const std::string health = Exchange(port, "GET /health HTTP/1.0\r\n\r\n");
  EXPECT_THAT(health, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(health, HasSubstr("{\"status\":\"ok\"}"));
  EXPECT_TRUE(errors.Counts().empty());
}

TEST(HttpServerTest, HealthAnswersWhatTheNodeSays) {
  MetricsExchange ex;
  HttpServerOptions o;
  o.address = {"127.0.0.1", 0};
  o.metrics = &ex;
  o.health = [] { return HealthReply{503, "{\"status\":\"draining\"}"}; };
  auto server = HttpServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string h = Exchange((*server)->port(), "GET /health HTTP/1.0\r\n\r\n");
  EXPECT_THAT(h, StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(h, HasSubstr("draining"));
}

TEST(HttpServerTest, BadRequestsGetTableCodedJsonAndTheServerStaysUp) {
  MetricsExchange ex;
  ErrorCounter errors;
  auto server = StartOn0(&ex, &errors, "", 2048);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::string nope = Exchange(port, "GET /nope HTTP/1.0\r\n\r\n");
  EXPECT_THAT(nope, StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(nope, HasSubstr("\"code\":\"not_found\""));
  EXPECT_THAT(nope, HasSubstr("application/json"));
  // A body over the limit is refused from its Content-Length, unread.
  const std::string big =
      Exchange(port, "POST /v1/completions HTTP/1.0\r\nContent-Length: 5000\r\n\r\n" +
                         std::string(5000, 'x'));
  EXPECT_THAT(big, StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(big, HasSubstr("\"code\":\"frame_too_large\""));
  EXPECT_THAT(Exchange(port, "BREW /pot HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.1 400"));
  {  // connect and close: nothing to answer, and the server stays up
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    ::close(fd);
  }
  // No renderer: a scrape still answers (with the last text, empty here) after the wait.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THAT(Exchange(port, "GET /metrics HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.1 200"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_THAT(Exchange(port, "GET /health HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.1 200"));
  const auto counts = errors.Counts();
  EXPECT_EQ(counts.at("not_found"), 1);
  EXPECT_EQ(counts.at("frame_too_large"), 1);
  EXPECT_GE(counts.at("bad_request"), 1);
}

TEST(HttpServerTest, ApiKeyGuardsV1RoutesOnly) {
  MetricsExchange ex;
  ErrorCounter errors;
  auto server = StartOn0(&ex, &errors, "s3cret");
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::string none = Exchange(port, "GET /v1/models HTTP/1.0\r\n\r\n");
  EXPECT_THAT(none, StartsWith("HTTP/1.1 401"));
  EXPECT_THAT(none, HasSubstr("\"code\":\"unauthorized\""));
  EXPECT_THAT(none, HasSubstr("WWW-Authenticate: Bearer"));
  EXPECT_THAT(Exchange(port, "GET /v1/models HTTP/1.0\r\nAuthorization: Bearer s3cre\r\n\r\n"),
              StartsWith("HTTP/1.1 401"));
  EXPECT_THAT(Exchange(port, "GET /v1/models HTTP/1.0\r\nAuthorization: Bearer s3cretX\r\n\r\n"),
              StartsWith("HTTP/1.1 401"));
  // The right key passes auth (no API routes on this server: 404 after it).
  EXPECT_THAT(Exchange(port, "GET /v1/models HTTP/1.0\r\nAuthorization: Bearer s3cret\r\n\r\n"),
              StartsWith("HTTP/1.1 404"));
  // Metrics and health stay open, as vLLM's --api-key leaves them.
  EXPECT_THAT(Exchange(port, "GET /health HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(Exchange(port, "GET /metrics HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(errors.Counts().at("unauthorized"), 3);
}

TEST(HttpServerTest, AddressesAndStartErrors) {
  for (const char* bad :
       {"", "localhost:9464", "127.0.0.1:70000", "127.0.0.1:x", "1.2.3:80", "9464"}) {
    EXPECT_FALSE(ValidateMetricsAddress(bad).ok()) << bad;
  }
  EXPECT_TRUE(ValidateMetricsAddress("127.0.0.1:9464").ok());
  auto p = ParseHttpAddress("8000");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->host, "127.0.0.1");  // loopback unless a host is named
  EXPECT_EQ(p->port, 8000);
  p = ParseHttpAddress("localhost:8001");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->text(), "127.0.0.1:8001");
  EXPECT_EQ(ParseHttpAddress("0.0.0.0:80")->host, "0.0.0.0");
  for (const char* bad : {"", "x", "host:80", "1.2.3.4:", ":80", "1.2.3.4:65536", "-1"}) {
    EXPECT_EQ(ParseHttpAddress(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  MetricsExchange ex;
  ErrorCounter errors;
  auto first = StartOn0(&ex, &errors);
  ASSERT_TRUE(first.ok()) << first.status();
  HttpServerOptions o;
  o.address = {"127.0.0.1", (*first)->port()};
  auto taken = HttpServer::Start(o);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(taken.status().message()), HasSubstr("127.0.0.1"));
}

// A listener with two POST routes: /v1/echo answers the body's size, /v1/hold holds its
// handler thread until `release` is set.
struct RoutedServer {
  MetricsExchange ex;
  ErrorCounter errors;
  std::atomic<bool> release{false};
  std::atomic<int> holding{0};
  std::unique_ptr<HttpServer> server;

  explicit RoutedServer(size_t max_body, int threads = 4, std::string api_key = "") {
    HttpServerOptions o;
    o.address = {"127.0.0.1", 0};
    o.threads = threads;
    o.metrics = &ex;
    o.errors = &errors;
    o.api_key = std::move(api_key);
    o.max_body_bytes = max_body;
    o.routes = [this](HttpRouter& r) {
      r.Post("/v1/echo",
             [](const httplib::Request&, const std::string& body, httplib::Response& res) {
               res.set_content("size " + std::to_string(body.size()), "text/plain");
             });
      r.Post("/v1/hold",
             [this](const httplib::Request&, const std::string&, httplib::Response& res) {
               ++holding;
               while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
               res.set_content("held", "text/plain");
             });
    };
    auto s = HttpServer::Start(o);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) server = *std::move(s);
  }
  ~RoutedServer() {
    release = true;
    server.reset();
  }
  int port() const { return server->port(); }
};

// An HTTP/1.1 chunked body of `n` bytes in chunks of up to 1000.
std::string Chunked(size_t n) {
  std::string out;
  for (size_t done = 0; done < n;) {
    const size_t c = std::min<size_t>(1000, n - done);
    char head[16];
    std::snprintf(head, sizeof head, "%zx\r\n", c);
    out += head + std::string(c, 'a') + "\r\n";
    done += c;
  }
  return out + "0\r\n\r\n";
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

const char kHealth[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";

// One keep-alive connection, a request and its response at a time (httplib reads no
// pipelined requests: a request's read buffer goes with it).
class Conversation {
 public:
  explicit Conversation(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    timeval tv{3, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  }
  ~Conversation() { ::close(fd_); }
  // Sends `request` and returns one response (headers + Content-Length bytes of body); ""
  // when the connection ended first.
  std::string Ask(const std::string& request) {
    if (!connected_) return "";
    ::send(fd_, request.data(), request.size(), MSG_NOSIGNAL);
    std::string out;
    size_t want = std::string::npos;
    char buf[4096];
    while (out.size() < want) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return out;
      out.append(buf, static_cast<size_t>(n));
      const size_t end = out.find("\r\n\r\n");
      if (want == std::string::npos && end != std::string::npos) {
        const size_t cl = out.find("Content-Length: ");
        want = end + 4 + (cl < end ? std::stoul(out.substr(cl + 16)) : 0);
      }
    }
    return out;
  }
  // True when the server has closed the connection (reads end) within the timeout.
  bool Closed() {
    char c;
    return ::recv(fd_, &c, 1, 0) == 0;
  }
  // True when all of `bytes` went out (not cut by the server's close or reset).
  bool Send(const std::string& bytes) {
    for (size_t done = 0; done < bytes.size();) {
      const ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }
  // Whatever else arrives until the connection ends or the timeout passes.
  std::string Rest() {
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd_, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
    return out;
  }

 private:
  int fd_;
  bool connected_ = false;
};

TEST(HttpServerTest, ChunkedAndFormBodiesAreBoundedAfterDecodingAndTheConnectionStaysInStep) {
  RoutedServer rs(4096);
  ASSERT_NE(rs.server, nullptr);
  const std::string chunked_head =
      "POST /v1/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  // Within the limit: the route gets it all.
  Conversation c(rs.port());
  std::string ok = c.Ask(chunked_head + Chunked(3000));
  EXPECT_THAT(ok, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(ok, HasSubstr("size 3000"));
  // Over it: 413, the rest read and dropped, and the next request on the connection served.
  std::string big = c.Ask(chunked_head + Chunked(50000));
  EXPECT_THAT(big, StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(big, HasSubstr("\"code\":\"frame_too_large\""));
  EXPECT_THAT(big, HasSubstr("serve.http_max_body_bytes"));
  EXPECT_THAT(c.Ask(kHealth), StartsWith("HTTP/1.1 200"));
  // A form-encoded body (curl -d without a Content-Type) is the body too, up to the limit
  // (not httplib's 8 KiB for forms, which this listener's 4 KiB stays under here anyway).
  RoutedServer wide(64 << 10);
  std::string form =
      Exchange(wide.port(),
               "POST /v1/echo HTTP/1.0\r\nContent-Type: application/x-www-form-urlencoded\r\n"
               "Content-Length: 20000\r\n\r\n" +
                   std::string(20000, 'f'));
  EXPECT_THAT(form, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(form, HasSubstr("size 20000"));
  EXPECT_EQ(rs.errors.Counts().at("frame_too_large"), 1);
}

TEST(HttpServerTest, RefusalsBeforeTheBodyCloseTheConnection) {
  RoutedServer rs(1 << 20, 4, "s3cret");
  ASSERT_NE(rs.server, nullptr);
  // Refused before routing with a body unread: that body (a request itself here) must never
  // be read as the next request, so the connection closes.
  const std::string smuggled = kHealth;
  {
    Conversation c(rs.port());
    std::string r = c.Ask("GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                          std::to_string(smuggled.size()) + "\r\n\r\n" + smuggled);
    EXPECT_THAT(r, StartsWith("HTTP/1.1 401"));
    EXPECT_THAT(r, HasSubstr("Connection: close"));
    EXPECT_EQ(Count(r, "HTTP/1.1 "), 1u) << r;
    EXPECT_TRUE(c.Closed());
  }
  {  // A chunked body for a route that reads none: refused unread, the connection closed.
    Conversation c(rs.port());
    std::string r = c.Ask(
        "POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + Chunked(100));
    EXPECT_THAT(r, StartsWith("HTTP/1.1 400"));
    EXPECT_TRUE(c.Closed());
  }
  {  // A POST route reads the body before the key: the connection carries on after the 401.
    Conversation c(rs.port());
    EXPECT_THAT(c.Ask("POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"),
                StartsWith("HTTP/1.1 401"));
    EXPECT_THAT(c.Ask(kHealth), StartsWith("HTTP/1.1 200"));
  }
  std::string r;
  r = Exchange(rs.port(),
               "POST /v1/echo HTTP/1.0\r\nAuthorization: Bearer s3cret\r\n"
               "Content-Type: multipart/form-data; boundary=x\r\nContent-Length: 4\r\n"
               "\r\n--x-");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 400"));
  EXPECT_THAT(r, HasSubstr("multipart"));
}

TEST(HttpServerTest, WrongMethodOnAKnownPathIs405NamingTheRightOne) {
  RoutedServer rs(1 << 20);
  ASSERT_NE(rs.server, nullptr);
  std::string r = Exchange(rs.port(), "GET /v1/echo HTTP/1.0\r\n\r\n");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 405"));
  EXPECT_THAT(r, HasSubstr("Allow: POST"));
  EXPECT_THAT(r, HasSubstr("\"code\":\"not_found\""));
  r = Exchange(rs.port(), "POST /health HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}");
  EXPECT_THAT(r, StartsWith("HTTP/1.1 405"));
  EXPECT_THAT(r, HasSubstr("Allow: GET"));
  EXPECT_THAT(Exchange(rs.port(), "GET /v1/nope HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.1 404"));
}

TEST(HttpServerTest, HealthAnswersAndGenerationIsTurnedAwayWhileEveryWorkerIsHeld) {
  RoutedServer rs(1 << 20, /*threads=*/1);
  ASSERT_NE(rs.server, nullptr);
  std::string held;
  std::thread holder(
      [&] { held = Exchange(rs.port(), "POST /v1/hold HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}"); });
  while (rs.holding == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto t0 = std::chrono::steady_clock::now();
  std::string h = Exchange(rs.port(), "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_THAT(h, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(h, HasSubstr("Connection: close"));  // back to a worker next time
  std::string busy = Exchange(rs.port(),
                              "POST /v1/echo HTTP/1.1\r\nHost: x\r\n"
                              "Content-Length: 2\r\n\r\n{}");
  EXPECT_THAT(busy, StartsWith("HTTP/1.1 429"));
  EXPECT_THAT(busy, HasSubstr("Retry-After: 1"));
  EXPECT_THAT(busy, HasSubstr("\"code\":\"overloaded\""));
  EXPECT_THAT(busy, HasSubstr("serve.http_threads"));
  rs.release = true;
  holder.join();
  EXPECT_THAT(held, HasSubstr("held"));
  // Served again once the worker is back: the client read the held answer a moment before
  // the worker finished with its connection, so a 429 (as a client would, retried) may come
  // first, for a bounded time.
  std::string again;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  do {
    again = Exchange(rs.port(), "POST /v1/echo HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}");
    if (!again.starts_with("HTTP/1.1 429")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < until);
  EXPECT_THAT(again, HasSubstr("size 2"));
}

TEST(HttpServerTest, ContentLengthOverTheLimitIsRefusedAtOnceAndNothingAfterItIsARequest) {
  RoutedServer rs(4096);
  ASSERT_NE(rs.server, nullptr);
  const std::string head = "POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n";
  {  // The body's first bytes are a request: refused before they are read, never answered.
    Conversation c(rs.port());
    const auto t0 = std::chrono::steady_clock::now();
    std::string r = c.Ask(head + kHealth);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    EXPECT_THAT(r, StartsWith("HTTP/1.1 413"));
    EXPECT_THAT(r, HasSubstr("X-Specnode-Error-Code: frame_too_large"));
    EXPECT_THAT(r, HasSubstr("\"code\":\"frame_too_large\""));
    EXPECT_THAT(r, HasSubstr("Connection: close"));
    c.Send(kHealth);  // more body bytes, sent after the answer
    const std::string rest = c.Rest();
    EXPECT_EQ(Count(r + rest, "HTTP/1.1 "), 1u) << r << rest;
  }
  {  // Only the headers, the body never sent: the answer still comes at once, then the end.
    Conversation c(rs.port());
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_THAT(c.Ask(head), StartsWith("HTTP/1.1 413"));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    EXPECT_TRUE(c.Closed());
  }
  {  // A client that sends its whole body (more than the socket buffers hold) before reading
     // still reads the answer: the rest is read and dropped after it, not met with a reset.
    const size_t n = size_t{16} << 20;
    Conversation c(rs.port());
    EXPECT_TRUE(c.Send("POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(n) +
                       "\r\n\r\n" + std::string(n, 'x')));
    const std::string whole = c.Rest();
    EXPECT_THAT(whole, StartsWith("HTTP/1.1 413"));
    EXPECT_EQ(Count(whole, "HTTP/1.1 "), 1u);
  }
  // The same on a route that reads no body and on one that does not exist.
  EXPECT_THAT(Exchange(rs.port(), "POST /nope HTTP/1.0\r\nContent-Length: 5000\r\n\r\n"),
              StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(Exchange(rs.port(), "GET /health HTTP/1.0\r\n\r\n"), StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(rs.errors.Counts().at("frame_too_large"), 4);
}

TEST(HttpServerTest, ABodyOnARouteThatReadsNoneIsNeverReadAsARequest) {
  RoutedServer rs(4096);
  ASSERT_NE(rs.server, nullptr);
  const std::string smuggled = kHealth;
  Conversation c(rs.port());
  std::string r = c.Ask("GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: " +
                        std::to_string(smuggled.size()) + "\r\n\r\n" + smuggled);
  EXPECT_THAT(r, StartsWith("HTTP/1.1 400"));
  EXPECT_THAT(r, HasSubstr("X-Specnode-Error-Code: bad_request"));
  const std::string rest = c.Rest();
  EXPECT_EQ(Count(r + rest, "HTTP/1.1 "), 1u) << r << rest;
  // An empty body (Content-Length: 0, as some clients send on a GET) is no body.
  EXPECT_THAT(Exchange(rs.port(), "GET /health HTTP/1.0\r\nContent-Length: 0\r\n\r\n"),
              StartsWith("HTTP/1.1 200"));
}

// A method that takes a body, with neither a length nor chunks: httplib would wait for the
// end of the connection. 411 at once instead, and the connection closes: the bytes after
// the headers are never read as a request.
TEST(HttpServerTest, ABodyWithoutALengthIs411AtOnce) {
  RoutedServer rs(4096);
  ASSERT_NE(rs.server, nullptr);
  for (const char* method : {"POST", "PUT", "DELETE"}) {
    Conversation c(rs.port());
    const auto t0 = std::chrono::steady_clock::now();
    const std::string r = c.Ask(std::string(method) + " /v1/echo HTTP/1.1\r\nHost: x\r\n\r\n");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << method;
    EXPECT_THAT(r, StartsWith("HTTP/1.1 411")) << method;
    EXPECT_THAT(r, HasSubstr("X-Specnode-Error-Code: bad_request"));
    EXPECT_THAT(r, HasSubstr("needs a Content-Length"));
    EXPECT_THAT(r, HasSubstr("Connection: close"));
    c.Send(kHealth);
    const std::string rest = c.Rest();
    EXPECT_EQ(Count(r + rest, "HTTP/1.1 "), 1u) << r << rest;
  }
  // A length of 0 is a length; a chunked body needs none.
  EXPECT_THAT(Exchange(rs.port(), "POST /nope HTTP/1.0\r\nContent-Length: 0\r\n\r\n"),
              StartsWith("HTTP/1.1 404"));
  EXPECT_THAT(Exchange(rs.port(), "POST /v1/echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                  "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"),
              StartsWith("HTTP/1.1 200"));
  EXPECT_EQ(rs.errors.Counts().at("bad_request"), 3);
}

// httplib's own refusals (routing, a request it cannot parse) carry the code header too.
TEST(HttpServerTest, EveryErrorCarriesTheErrorCodeHeader) {
  RoutedServer rs(4096);
  ASSERT_NE(rs.server, nullptr);
  struct Case {
    std::string request;
    const char* status;
    const char* code;
  };
  const std::string big(9000, 'a');
  const Case cases[] = {
      {"GET /nope HTTP/1.0\r\n\r\n", "HTTP/1.1 404", "not_found"},
      {"POST /nope HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}", "HTTP/1.1 404", "not_found"},
      {"GET /v1/echo HTTP/1.0\r\n\r\n", "HTTP/1.1 405", "not_found"},
      {"POST /health HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}", "HTTP/1.1 405", "not_found"},
      {"GET /health HTTP/1.0\r\nX-Big: " + big + "\r\n\r\n", "HTTP/1.1 400", "bad_request"},
      {"GET /" + big + " HTTP/1.0\r\n\r\n", "HTTP/1.1 414", "bad_request"},
      {"BREW /pot HTTP/1.0\r\n\r\n", "HTTP/1.1 400", "bad_request"},
      {"GET /health HTTP/1.0\r\nRange: bytes=x\r\n\r\n", "HTTP/1.1 416", "bad_request"},
      {"POST /nope HTTP/1.0\r\nContent-Length: 5000\r\n\r\n", "HTTP/1.1 413", "frame_too_large"},
  };
  for (const Case& k : cases) {
    const std::string r = Exchange(rs.port(), k.request);
    EXPECT_THAT(r, StartsWith(k.status)) << k.request.substr(0, 40);
    EXPECT_THAT(r, HasSubstr(std::string("X-Specnode-Error-Code: ") + k.code))
        << k.request.substr(0, 40) << "\n"
        << r;
    EXPECT_THAT(r, HasSubstr(std::string("\"code\":\"") + k.code + "\""))
        << k.request.substr(0, 40);
  }
  // A header httplib cannot read leaves the connection out of step: it closes, and what
  // follows is not answered.
  Conversation c(rs.port());
  std::string r = c.Ask("GET /health HTTP/1.1\r\nX-Big: " + big + "\r\n\r\n" + kHealth);
  EXPECT_THAT(r, StartsWith("HTTP/1.1 400"));
  const std::string rest = c.Rest();
  EXPECT_EQ(Count(r + rest, "HTTP/1.1 "), 1u) << rest;
}

TEST(HttpServerTest, StopsPromptly) {
  MetricsExchange ex;
  ErrorCounter errors;
  auto server = StartOn0(&ex, &errors);
  ASSERT_TRUE(server.ok()) << server.status();
  const auto t0 = std::chrono::steady_clock::now();
  server->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

}  // namespace
}  // namespace specnode

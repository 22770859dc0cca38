// The HTTP metrics endpoint (node/metrics_http.h) over a real loopback socket: what a
// scraper gets, bad requests, the render hand-over, and start-up errors.
#include "node/serve/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specnode {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Sends `request` to 127.0.0.1:port and returns everything the server answers.
std::string Exchange(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return "connect failed";
  }
  ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
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

TEST(MetricsHttpTest, ServesFreshMetricsAndHealth) {
  MetricsExchange ex;
  Renderer renderer(&ex);
  auto server = MetricsHttpServer::Start("127.0.0.1:0", &ex);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  const std::string first = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_THAT(first, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(first, HasSubstr("Content-Type: text/plain; version=0.0.4"));
  EXPECT_THAT(first, HasSubstr("Connection: close"));
  EXPECT_THAT(first, HasSubstr("\r\n\r\nspecnode_requests_total{outcome=\"completed\"} 1\n"));
  // Every scrape asks for a new render.
  const std::string second = Exchange(port, "GET /metrics?x=1 HTTP/1.0\r\n\r\n");
  EXPECT_THAT(second, HasSubstr("} 2\n"));
  EXPECT_EQ(renderer.renders(), 2);
  EXPECT_THAT(Exchange(port, "GET /health HTTP/1.1\r\n\r\n"), HasSubstr("\r\n\r\nok\n"));
  // HEAD: headers only.
  const std::string head = Exchange(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_THAT(head, StartsWith("HTTP/1.1 200 OK"));
  EXPECT_THAT(head, ::testing::EndsWith("\r\n\r\n"));
}

TEST(MetricsHttpTest, BadRequestsGetErrorsAndTheServerStaysUp) {
  MetricsExchange ex;
  auto server = MetricsHttpServer::Start("127.0.0.1:0", &ex);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  EXPECT_THAT(Exchange(port, "GET /nope HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 404"));
  const std::string post = Exchange(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_THAT(post, StartsWith("HTTP/1.1 405"));
  EXPECT_THAT(post, HasSubstr("Allow: GET, HEAD"));
  EXPECT_THAT(Exchange(port, "garbage\r\n\r\n"), StartsWith("HTTP/1.1 400"));
  EXPECT_THAT(Exchange(port, std::string(12000, 'A')), StartsWith("HTTP/1.1 431"));
  EXPECT_EQ(Exchange(port, ""), "");  // connect and close: nothing to answer
  // No renderer: a scrape still answers (with the last text, empty here) after the wait.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THAT(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_THAT(Exchange(port, "GET /health HTTP/1.1\r\n\r\n"), StartsWith("HTTP/1.1 200"));
}

TEST(MetricsHttpTest, StartErrors) {
  MetricsExchange ex;
  for (const char* bad :
       {"", "9464", "localhost:9464", "127.0.0.1:70000", "127.0.0.1:x", "1.2.3:80"}) {
    auto s = MetricsHttpServer::Start(bad, &ex);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_FALSE(ValidateMetricsAddress(bad).ok()) << bad;
  }
  EXPECT_TRUE(ValidateMetricsAddress("127.0.0.1:9464").ok());
  auto first = MetricsHttpServer::Start("127.0.0.1:0", &ex);
  ASSERT_TRUE(first.ok()) << first.status();
  auto taken = MetricsHttpServer::Start("127.0.0.1:" + std::to_string((*first)->port()), &ex);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(taken.status().message()), HasSubstr("in use"));
}

TEST(MetricsHttpTest, StopsPromptly) {
  MetricsExchange ex;
  auto server = MetricsHttpServer::Start("127.0.0.1:0", &ex);
  ASSERT_TRUE(server.ok()) << server.status();
  const auto t0 = std::chrono::steady_clock::now();
  server->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

}  // namespace
}  // namespace specnode

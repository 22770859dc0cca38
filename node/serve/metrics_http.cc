#include "node/serve/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace specnode {
namespace {

constexpr size_t kMaxRequestBytes = 8192;
constexpr int kClientTimeoutMs = 2000;
constexpr auto kRenderWait = std::chrono::milliseconds(1000);

absl::StatusOr<sockaddr_in> ParseAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", address, "\": expected IPV4:PORT, e.g. 127.0.0.1:9464"));
  };
  if (colon == std::string::npos) return bad();
  int port = -1;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) return bad();
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr) != 1) return bad();
  return sa;
}

void WriteAll(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the client left; nothing to report to anyone
    off += static_cast<size_t>(n);
  }
}

std::string Response(int code, const char* reason, const std::string& content_type,
                     const std::string& body, const std::string& extra_headers = "") {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\n", extra_headers,
                      "Connection: close\r\n\r\n", body);
}

}  // namespace

std::string MetricsExchange::Fetch(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t seen = version_;
  wanted_.fetch_add(1, std::memory_order_release);
  cv_.wait_for(lock, wait, [&] { return version_ != seen; });
  wanted_.fetch_sub(1, std::memory_order_release);
  return text_;
}

void MetricsExchange::Publish(std::string text) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    text_ = std::move(text);
    ++version_;
  }
  cv_.notify_all();
}

absl::Status ValidateMetricsAddress(const std::string& address) {
  return ParseAddress(address).status();
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, MetricsExchange* exchange) {
  absl::StatusOr<sockaddr_in> sa = ParseAddress(address);
  if (!sa.ok()) return sa.status();
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->exchange_ = exchange;
  s->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("metrics socket: ", std::strerror(errno)));
  }
  const int one = 1;
  ::setsockopt(s->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(s->listen_fd_, reinterpret_cast<const sockaddr*>(&*sa), sizeof *sa) != 0 ||
      ::listen(s->listen_fd_, 16) != 0) {
    const int err = errno;
    ::close(s->listen_fd_);
    s->listen_fd_ = -1;
    return absl::UnavailableError(
        absl::StrCat("metrics endpoint ", address, ": ", std::strerror(err)));
  }
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  s->port_ = ntohs(bound.sin_port);
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void MetricsHttpServer::Loop() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;  // timeout (re-check stop_) or EINTR
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Serve(fd);
    // Lingering close: closing with unread request bytes would reset the connection and
    // could destroy the response before the client read it.
    ::shutdown(fd, SHUT_WR);
    char sink[4096];
    for (int i = 0; i < 16; ++i) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0 || ::recv(fd, sink, sizeof sink, 0) <= 0) break;
    }
    ::close(fd);
  }
}

void MetricsHttpServer::Serve(int fd) {
  // Read the request head (we need its first line only; a body, if any, is ignored).
  std::string req;
  char buf[1024];
  while (req.find("\r\n\r\n") == std::string::npos && req.size() < kMaxRequestBytes) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, kClientTimeoutMs) <= 0) return;  // too slow: drop it
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
  }
  const std::string line = req.substr(0, req.find("\r\n"));
  const std::vector<std::string> parts = absl::StrSplit(line, ' ');
  if (req.size() >= kMaxRequestBytes && req.find("\r\n\r\n") == std::string::npos) {
    WriteAll(fd, Response(431, "Request Header Fields Too Large", "text/plain", "too large\n"));
    return;
  }
  if (parts.size() != 3 || parts[2].rfind("HTTP/1.", 0) != 0) {
    WriteAll(fd, Response(400, "Bad Request", "text/plain", "bad request\n"));
    return;
  }
  const std::string& method = parts[0];
  std::string path = parts[1].substr(0, parts[1].find('?'));
  if (method != "GET" && method != "HEAD") {
    WriteAll(fd, Response(405, "Method Not Allowed", "text/plain", "GET only\n",
                          "Allow: GET, HEAD\r\n"));
    return;
  }
  std::string response;
  if (path == "/metrics") {
    response = Response(200, "OK", "text/plain; version=0.0.4; charset=utf-8",
                        exchange_->Fetch(kRenderWait));
  } else if (path == "/health") {
    response = Response(200, "OK", "text/plain", "ok\n");
  } else {
    response = Response(404, "Not Found", "text/plain", "try /metrics\n");
  }
  if (method == "HEAD") response = response.substr(0, response.find("\r\n\r\n") + 4);
  WriteAll(fd, response);
}

}  // namespace specnode

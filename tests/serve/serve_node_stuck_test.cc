// ServeNode (node/serve/serve_node.h) whose scheduler thread is stuck in the engine when
// SIGTERM comes (GatedRunner holds the first forward for good): after the drain limit and
// FrontendOptions::stop_wait_s (5 s), a request in flight on each front door — ZeroMQ and
// the OpenAI HTTP API — has its one `unavailable` reply, and the process exits 1
// (std::quick_exit) instead of hanging in a join. A death test, since the node ends its
// own process: the client threads' verdicts are read by an at_quick_exit handler.
#include "node/serve/serve_node.h"

#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "nlohmann/json.hpp"
#include "node/session/model_session.h"
#include "tests/coordinator/scheduler_test_util.h"

namespace specnode {
namespace {

using Json = nlohmann::json;
using scheduler_test::GatedRunner;
using scheduler_test::SchedulerTest;

// The client threads' verdicts (one per front door), for the at_quick_exit handler.
std::atomic<int> g_answered{0};
std::atomic<bool> g_wrong{false};

void Verdict(bool ok, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", ok ? "ok" : "WRONG", what.c_str());
  if (ok) {
    g_answered.fetch_add(1);
  } else {
    g_wrong.store(true);
  }
}

// Runs inside ServeNode's std::quick_exit(1): every reply was sent before it (the sockets
// are closed by then), so the clients only have to read theirs.
void CheckFrontDoorsAtExit() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (g_answered.load() < 2 && !g_wrong.load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (g_answered.load() == 2 && !g_wrong.load()) {
    std::fprintf(stderr, "both front doors answered unavailable\n");
  }
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A ZeroMQ submit that gets accepted (ServeNode is in Frontend::Run, its signal handlers
// set) and then waits for its terminal reply; SIGTERM once the scheduler is stuck and the
// HTTP request is queued behind it.
void ZeroMqClient(const std::string& endpoint, int http_port, GatedRunner* runner) {
  zmq::context_t ctx;
  zmq::socket_t sock(ctx, zmq::socket_type::dealer);
  sock.set(zmq::sockopt::linger, 0);
  sock.set(zmq::sockopt::rcvtimeo, 30000);
  sock.connect(endpoint);
  const std::string submit =
      Json{{"type", "submit"}, {"id", "z"}, {"prompt", "hello world"}, {"max_tokens", 64}}.dump();
  sock.send(zmq::buffer(submit), zmq::send_flags::none);
  zmq::message_t msg;
  if (!sock.recv(msg) || Json::parse(msg.to_string()).value("type", "") != "accepted") {
    return Verdict(false, "zmq: no accepted reply");
  }
  runner->WaitHeld();
  httplib::Client http("127.0.0.1", http_port);
  for (int i = 0; i < 3000; ++i) {  // until the HTTP request is in too
    auto h = http.Get("/health");
    if (h && Json::parse(h->body).value("queued", 0) >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(getpid(), SIGTERM);
  while (sock.recv(msg)) {
    const Json j = Json::parse(msg.to_string());
    const std::string type = j.value("type", "");
    if (type != "done" && type != "error") continue;
    return Verdict(type == "error" && j.value("code", "") == "unavailable", "zmq: " + j.dump());
  }
  Verdict(false, "zmq: no terminal reply");
}

void HttpClient(int http_port) {
  httplib::Client http("127.0.0.1", http_port);
  http.set_read_timeout(60, 0);
  for (int i = 0; i < 3000 && !http.Get("/health"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto res =
      http.Post("/v1/completions", R"({"prompt": "hello", "max_tokens": 16})", "application/json");
  if (!res) return Verdict(false, "http: no response");
  const Json j = Json::parse(res->body, nullptr, false);
  const bool ok = res->status == 503 && j.is_object() && j.contains("error") &&
                  j["error"].value("code", "") == "unavailable";
  Verdict(ok, "http: " + std::to_string(res->status) + " " + res->body);
}

// One HTTP exchange on this thread before the client threads start: httplib's client
// parses a response with function-local static regexes inside the uninstrumented
// libcpp-httplib, whose initialisation guard TSan cannot see, so two client threads making
// their first exchange at once were reported as a race on the regex (CI, TSan). Initialised
// here, thread creation orders them before both clients.
void WarmHttplibClient() {
  httplib::Server server;
  server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("", "text/plain");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread t([&server] { server.listen_after_bind(); });
  while (!server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  httplib::Client("127.0.0.1", port).Get("/");
  server.stop();
  t.join();
}

// The death test's child: never returns.
[[noreturn]] void ServeWithAStuckEngine(const std::string& model_path,
                                        std::unique_ptr<LocalModelRunner> inner) {
  auto session = ModelSession::Open(model_path, 1, false);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
    std::_Exit(3);
  }
  std::filesystem::remove(model_path);  // loaded; the child never reaches TearDown
  GatedRunner runner(std::move(inner), /*hold_at=*/1);  // released by nobody
  std::vector<ServeGroup> groups(1);
  groups[0].name = "local";
  groups[0].target = &runner;
  ServeConfig cfg;
  cfg.model = model_path;
  cfg.bind = "ipc://@specnode_serve_node_stuck_" + std::to_string(getpid());  // abstract
  cfg.drain_timeout_s = 0.2;
  cfg.http_bind = HttpAddress{"127.0.0.1", FreePort()};
  cfg.http_api_key_env = "";
  cfg.http_threads = 4;
  std::at_quick_exit(CheckFrontDoorsAtExit);
  WarmHttplibClient();
  std::thread(ZeroMqClient, cfg.bind, cfg.http_bind->port, &runner).detach();
  std::thread(HttpClient, cfg.http_bind->port).detach();
  std::thread([] {  // a node that hangs fails the test instead of the ctest timeout
    std::this_thread::sleep_for(std::chrono::seconds(60));
    std::fprintf(stderr, "the node hung\n");
    std::_Exit(5);
  }).detach();
  const absl::Status st = ServeNode(cfg, session->get(), groups, {});
  std::fprintf(stderr, "ServeNode returned (%s) with its scheduler thread stuck\n",
               st.ToString().c_str());
  std::_Exit(4);
}

class ServeNodeStuckDeathTest : public SchedulerTest {};

TEST_F(ServeNodeStuckDeathTest, BothFrontDoorsAnswerUnavailableAndTheNodeExits) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(ServeWithAStuckEngine(path_, Runner(64 << 20)), testing::ExitedWithCode(1),
              "both front doors answered unavailable");
}

}  // namespace
}  // namespace specnode

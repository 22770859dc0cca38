// specnode-client: submit prompts to `specnode serve`, stream the reply, read stats and
// health, over the ZeroMQ JSON protocol of docs/protocol.md.
//
// Exit codes: 0 done, 1 the node answered with an error (code + message on stderr),
// 2 usage error, 3 timeout or no node at the endpoint, 130 interrupted (Ctrl-C cancels the
// request, waits for its final `done`, then exits 130).
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/client_connection.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;
using specnode::client::ClientConnection;
using specnode::client::ConnectionOptions;
using Clock = std::chrono::steady_clock;

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitTimeout = 3;
constexpr int kExitInterrupted = 130;

constexpr const char* kUsage =
    "usage: specnode-client [--endpoint E] <command> [options]\n"
    "\n"
    "Talks to `specnode serve` over ZeroMQ (docs/protocol.md).\n"
    "\n"
    "commands:\n"
    "  submit    --prompt TEXT | --prompt-file PATH | --chat TEXT [options]\n"
    "            stream the reply to stdout, then per-request stats to stderr\n"
    "  stats     print the node's metrics (Prometheus text; --json: the whole reply)\n"
    "  health    print the node's health; exit 0 when its status is \"ok\", else 1\n"
    "  cancel    --id ID: cancel a request. The node scopes ids to a connection, so a\n"
    "            cancel from another process answers unknown_id; to stop a running\n"
    "            `submit`, press Ctrl-C in it (it sends the cancel on its own connection)\n"
    "\n"
    "options for every command:\n"
    "  --endpoint E        node address (default $SPECNODE_ENDPOINT, else tcp://127.0.0.1:5555)\n"
    "  --timeout-s S       give up (exit 3) when the node is unreachable or sends nothing for\n"
    "                      S seconds (default 60 for submit, 10 otherwise)\n"
    "  --json              print the node's final reply as one JSON object on stdout\n"
    "  --curve-server-key K   CurveZMQ: the node's public key (Z85, 40 chars) turns CURVE on\n"
    "  --curve-public-key K --curve-secret-key K\n"
    "                      this client's key pair (default: a fresh pair per connection)\n"
    "\n"
    "submit options (sent only when given; the node applies its defaults and checks ranges):\n"
    "  --prompt TEXT       raw prompt text (no chat template)\n"
    "  --prompt-file PATH  raw prompt read from a file (\"-\": stdin)\n"
    "  --chat TEXT         a user chat message (the model's chat template is applied)\n"
    "  --system TEXT       with --chat: a system message before it\n"
    "  --max-tokens N      --temperature T   --top-p P   --top-k K   --seed S\n"
    "  --stop STR          stop string (repeatable)\n"
    "  --domain D          request domain (default: the node's router rules)\n"
    "  --sla CLASS         SLA class (default: the node's default class)\n"
    "  --no-stream         one reply at the end instead of streamed tokens\n"
    "  --id ID             request id (default: cli-<pid>)\n"
    "  --quiet             no stats on stderr\n"
    "\n"
    "exit codes: 0 done, 1 error reply, 2 usage, 3 timeout / no node, 130 interrupted\n";

std::atomic<int> g_interrupts{0};

void OnSigint(int) { g_interrupts.fetch_add(1); }

struct UsageError {
  std::string message;
};

struct Args {
  std::string command;
  std::string endpoint;
  std::optional<double> timeout_s;
  bool json = false;
  bool quiet = false;
  ConnectionOptions conn;
  // submit
  std::optional<std::string> prompt, prompt_file, chat, system, domain, sla, id;
  std::optional<int64_t> max_tokens, top_k, seed;
  std::optional<double> temperature, top_p;
  std::vector<std::string> stop;
  bool no_stream = false;
};

int64_t ParseInt(const std::string& key, const std::string& v) {
  int64_t out = 0;
  const char* end = v.data() + v.size();
  auto [ptr, ec] = std::from_chars(v.data(), end, out);
  if (ec != std::errc() || ptr != end || v.empty()) {
    throw UsageError{absl::StrFormat("%s: '%s' is not an integer", key, v)};
  }
  return out;
}

double ParseDouble(const std::string& key, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  const double out = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE) {
    throw UsageError{absl::StrFormat("%s: '%s' is not a number", key, v)};
  }
  return out;
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  if (const char* env = std::getenv("SPECNODE_ENDPOINT"); env != nullptr && *env != '\0') {
    a.endpoint = env;
  } else {
    a.endpoint = "tcp://127.0.0.1:5555";
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i) {
    std::string key = args[i];
    std::optional<std::string> inline_value;
    if (key.rfind("--", 0) == 0) {
      if (auto eq = key.find('='); eq != std::string::npos) {
        inline_value = key.substr(eq + 1);
        key = key.substr(0, eq);
      }
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) throw UsageError{key + " needs a value"};
      return args[++i];
    };
    auto flag = [&]() {
      if (inline_value) throw UsageError{key + " takes no value"};
    };
    if (key == "-h" || key == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(kExitOk);
    } else if (key == "--endpoint") {
      a.endpoint = value();
    } else if (key == "--timeout-s") {
      a.timeout_s = ParseDouble(key, value());
      if (!(*a.timeout_s > 0)) throw UsageError{"--timeout-s must be > 0"};
    } else if (key == "--json") {
      flag();
      a.json = true;
    } else if (key == "--quiet") {
      flag();
      a.quiet = true;
    } else if (key == "--curve-server-key") {
      a.conn.curve_server_key = value();
    } else if (key == "--curve-public-key") {
      a.conn.curve_public_key = value();
    } else if (key == "--curve-secret-key") {
      a.conn.curve_secret_key = value();
    } else if (key == "--prompt") {
      a.prompt = value();
    } else if (key == "--prompt-file") {
      a.prompt_file = value();
    } else if (key == "--chat") {
      a.chat = value();
    } else if (key == "--system") {
      a.system = value();
    } else if (key == "--max-tokens") {
      a.max_tokens = ParseInt(key, value());
    } else if (key == "--temperature") {
      a.temperature = ParseDouble(key, value());
    } else if (key == "--top-p") {
      a.top_p = ParseDouble(key, value());
    } else if (key == "--top-k") {
      a.top_k = ParseInt(key, value());
    } else if (key == "--seed") {
      a.seed = ParseInt(key, value());
    } else if (key == "--stop") {
      a.stop.push_back(value());
    } else if (key == "--domain") {
      a.domain = value();
    } else if (key == "--sla") {
      a.sla = value();
    } else if (key == "--no-stream") {
      flag();
      a.no_stream = true;
    } else if (key == "--id") {
      a.id = value();
    } else if (key.rfind("-", 0) == 0) {
      throw UsageError{"unknown option " + key};
    } else if (a.command.empty()) {
      a.command = key;
    } else {
      throw UsageError{absl::StrFormat("unexpected argument '%s'", key)};
    }
  }
  if (a.command.empty()) throw UsageError{"missing command (submit, stats, health or cancel)"};
  if (a.command != "submit" && a.command != "stats" && a.command != "health" &&
      a.command != "cancel") {
    throw UsageError{"unknown command '" + a.command + "'"};
  }
  const bool has_submit_opts = a.prompt || a.prompt_file || a.chat || a.system || a.domain ||
                               a.sla || a.max_tokens || a.top_k || a.seed || a.temperature ||
                               a.top_p || !a.stop.empty() || a.no_stream;
  if (a.command != "submit" && has_submit_opts) {
    throw UsageError{"request options (--prompt, --max-tokens, ...) only go with submit"};
  }
  if (a.command == "submit") {
    const int sources = (a.prompt ? 1 : 0) + (a.prompt_file ? 1 : 0) + (a.chat ? 1 : 0);
    if (sources != 1)
      throw UsageError{"submit needs exactly one of --prompt, --prompt-file, --chat"};
    if (a.system && !a.chat) throw UsageError{"--system goes with --chat"};
  }
  if (a.command == "cancel" && !a.id) throw UsageError{"cancel needs --id ID"};
  if (a.command == "stats" || a.command == "health") {
    if (a.id) throw UsageError{"--id only goes with submit and cancel"};
  }
  a.conn.endpoint = a.endpoint;
  return a;
}

double TimeoutS(const Args& a) { return a.timeout_s.value_or(a.command == "submit" ? 60.0 : 10.0); }

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void PrintJson(const json& j) {
  std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << std::endl;
}

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

int ReportErrorReply(const json& reply, bool as_json) {
  if (as_json) PrintJson(reply);
  std::fprintf(stderr, "specnode-client: error %s: %s\n", Str(reply, "code").c_str(),
               Str(reply, "message").c_str());
  return kExitError;
}

int ReportStatus(const absl::Status& s) {
  std::fprintf(stderr, "specnode-client: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kUnavailable ||
                 s.code() == absl::StatusCode::kDeadlineExceeded
             ? kExitTimeout
             : kExitError;
}

std::unique_ptr<ClientConnection> Connect(Args& a, int* exit_code) {
  a.conn.connect_timeout_ms = static_cast<int>(std::min(TimeoutS(a), 5.0) * 1000);
  auto conn = ClientConnection::Open(a.conn);
  if (!conn.ok()) {
    std::fprintf(stderr, "specnode-client: %s\n", std::string(conn.status().message()).c_str());
    *exit_code = kExitUsage;
    return nullptr;
  }
  return std::move(*conn);
}

// Waits for a reply of `type` (or an error without an id) to stats/health/cancel.
int OneShot(Args& a, const json& request, const std::string& want_type, json* reply) {
  int code = kExitOk;
  auto conn = Connect(a, &code);
  if (!conn) return code;
  if (auto s = conn->Send(request); !s.ok()) return ReportStatus(s);
  const auto deadline = Clock::now() + std::chrono::duration<double>(TimeoutS(a));
  while (Clock::now() < deadline) {
    const int left =
        static_cast<int>(
            std::chrono::duration<double, std::milli>(deadline - Clock::now()).count()) +
        1;
    auto msg = conn->Receive(left);
    if (!msg.ok()) return ReportStatus(msg.status());
    if (!msg->has_value()) continue;
    const json& m = **msg;
    const std::string type = Str(m, "type");
    if (type == want_type) {
      *reply = m;
      return kExitOk;
    }
    if (type == "error") {
      *reply = m;
      return ReportErrorReply(m, a.json);
    }
    if (type == "done") {  // a cancel that somehow found its request
      *reply = m;
      return kExitOk;
    }
  }
  std::fprintf(stderr, "specnode-client: timed out: no %s reply from %s within %g s\n",
               want_type.c_str(), a.endpoint.c_str(), TimeoutS(a));
  return kExitTimeout;
}

int RunStats(Args& a) {
  json reply;
  const int code = OneShot(a, json{{"type", "stats"}}, "stats", &reply);
  if (code != kExitOk || Str(reply, "type") != "stats") return code;
  if (a.json || !reply.contains("metrics") || !reply["metrics"].is_string()) {
    PrintJson(reply);
  } else {
    std::string metrics = reply["metrics"].get<std::string>();
    if (!metrics.empty() && metrics.back() != '\n') metrics += '\n';
    std::fwrite(metrics.data(), 1, metrics.size(), stdout);
  }
  return kExitOk;
}

int RunHealth(Args& a) {
  json reply;
  const int code = OneShot(a, json{{"type", "health"}}, "health", &reply);
  if (code != kExitOk) return code;
  const std::string status = Str(reply, "status");
  if (a.json) {
    PrintJson(reply);
  } else {
    std::printf("%s model=%s uptime_s=%s active=%s queued=%s\n", status.c_str(),
                Str(reply, "model").c_str(), Str(reply, "uptime_s").c_str(),
                Str(reply, "active").c_str(), Str(reply, "queued").c_str());
  }
  return status == "ok" ? kExitOk : kExitError;
}

int RunCancel(Args& a) {
  json reply;
  const int code = OneShot(a, json{{"type", "cancel"}, {"id", *a.id}}, "done", &reply);
  if (code == kExitError && Str(reply, "code") == "unknown_id") {
    std::fprintf(stderr,
                 "specnode-client: request ids are scoped to the connection that submitted "
                 "them; press Ctrl-C in the submitting specnode-client to cancel its request\n");
  }
  if (code == kExitOk && a.json) PrintJson(reply);
  return code;
}

json Double(double v) { return json(v); }

std::string ReadPromptFile(const std::string& path) {
  if (path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError{absl::StrFormat("--prompt-file: cannot read '%s'", path)};
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json BuildSubmit(const Args& a, const std::string& id) {
  json m = {{"type", "submit"}, {"id", id}};
  if (a.prompt) m["prompt"] = *a.prompt;
  if (a.prompt_file) m["prompt"] = ReadPromptFile(*a.prompt_file);
  if (a.chat) {
    json messages = json::array();
    if (a.system) messages.push_back({{"role", "system"}, {"content", *a.system}});
    messages.push_back({{"role", "user"}, {"content", *a.chat}});
    m["messages"] = messages;
  }
  if (a.max_tokens) m["max_tokens"] = *a.max_tokens;
  if (a.temperature) m["temperature"] = Double(*a.temperature);
  if (a.top_p) m["top_p"] = Double(*a.top_p);
  if (a.top_k) m["top_k"] = *a.top_k;
  if (a.seed) m["seed"] = *a.seed;
  if (!a.stop.empty()) m["stop"] = a.stop;
  if (a.domain) m["domain"] = *a.domain;
  if (a.sla) m["sla"] = *a.sla;
  if (a.no_stream) m["stream"] = false;
  return m;
}

double Num(const json& stats, const char* key, double fallback = -1) {
  auto it = stats.find(key);
  return it != stats.end() && it->is_number() ? it->get<double>() : fallback;
}

void PrintStats(const json& done, const std::string& id, double client_ttft_ms, double wall_ms) {
  const json stats = done.value("stats", json::object());
  std::string line = absl::StrFormat("--- %s: %s", id, Str(done, "finish_reason"));
  const double completion = Num(stats, "completion_tokens");
  line += absl::StrFormat(" | tokens: prompt %g, completion %g", Num(stats, "prompt_tokens"),
                          completion);
  line += absl::StrFormat(" | TTFT %.1f ms, TPOT %.1f ms, total %.1f ms, queue %.1f ms",
                          Num(stats, "ttft_ms"), Num(stats, "tpot_ms"), Num(stats, "total_ms"),
                          Num(stats, "queue_ms"));
  const double drafted = Num(stats, "drafted", 0), accepted = Num(stats, "accepted", 0);
  if (drafted > 0) {
    line += absl::StrFormat(" | acceptance %g/%g (%.1f%%), %g target passes", accepted, drafted,
                            100.0 * accepted / drafted, Num(stats, "target_passes"));
  } else {
    line += " | no drafts";
  }
  line += absl::StrFormat(" | domain %s, sla %s", Str(stats, "domain"), Str(stats, "sla"));
  line += absl::StrFormat(" | client: TTFT %s, wall %.1f ms",
                          client_ttft_ms >= 0 ? absl::StrFormat("%.1f ms", client_ttft_ms) : "-",
                          wall_ms);
  std::fprintf(stderr, "%s\n", line.c_str());
}

int RunSubmit(Args& a) {
  const std::string id = a.id.value_or(absl::StrFormat("cli-%d", static_cast<int>(getpid())));
  const json request = BuildSubmit(a, id);

  int code = kExitOk;
  auto conn = Connect(a, &code);
  if (!conn) return code;

  // Ctrl-C: first one cancels the request and waits for its `done`; a second one quits.
  struct sigaction sa {};
  sa.sa_handler = OnSigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: interrupt the poll
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const auto t0 = Clock::now();
  if (auto s = conn->Send(request); !s.ok()) return ReportStatus(s);

  const auto idle = std::chrono::duration<double>(TimeoutS(a));
  auto deadline = Clock::now() + idle;
  bool cancel_sent = false;
  bool printed_any = false;
  bool ends_with_newline = true;
  double client_ttft_ms = -1;
  int64_t expected_index = 0;
  int index_gaps = 0;
  std::string text;
  int chunks = 0;

  auto finish_text = [&]() {
    if (!a.json && printed_any && !ends_with_newline) std::fputc('\n', stdout);
    std::fflush(stdout);
  };

  while (true) {
    const int seen = g_interrupts.load();
    if (seen >= 2) {
      finish_text();
      std::fprintf(stderr, "specnode-client: interrupted again; not waiting for the node\n");
      return kExitInterrupted;
    }
    if (seen == 1 && !cancel_sent) {
      cancel_sent = true;
      if (auto s = conn->Send(json{{"type", "cancel"}, {"id", id}}); !s.ok()) {
        finish_text();
        ReportStatus(s);
        return kExitInterrupted;
      }
      std::fprintf(stderr, "\nspecnode-client: cancelling %s (Ctrl-C again to quit now)\n",
                   id.c_str());
      deadline = Clock::now() + idle;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      finish_text();
      std::fprintf(stderr, "specnode-client: timed out: no message from %s for %g s (request %s)\n",
                   a.endpoint.c_str(), TimeoutS(a), id.c_str());
      // Best effort: tell the node to stop generating for us.
      conn->SetLinger(200);
      (void)conn->Send(json{{"type", "cancel"}, {"id", id}});
      return cancel_sent ? kExitInterrupted : kExitTimeout;
    }
    const int slice = static_cast<int>(std::min<double>(
        100.0, std::chrono::duration<double, std::milli>(deadline - now).count() + 1));
    auto received = conn->Receive(slice);
    if (!received.ok()) {
      finish_text();
      return ReportStatus(received.status());
    }
    if (!received->has_value()) continue;
    const json& m = **received;
    deadline = Clock::now() + idle;
    const std::string type = Str(m, "type");
    const bool ours = m.contains("id") && m["id"].is_string() && m["id"].get<std::string>() == id;
    const bool no_id = !m.contains("id") || m["id"].is_null();

    if (type == "accepted" && ours) continue;
    if (type == "tokens" && ours) {
      const std::string piece = m.value("text", "");
      if (client_ttft_ms < 0) client_ttft_ms = MsSince(t0);
      if (m.contains("index") && m["index"].is_number_integer() &&
          m["index"].get<int64_t>() != expected_index) {
        ++index_gaps;
      }
      if (m.contains("token_ids") && m["token_ids"].is_array()) {
        expected_index =
            m.value("index", expected_index) + static_cast<int64_t>(m["token_ids"].size());
      }
      text += piece;
      ++chunks;
      if (!a.json && !piece.empty()) {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
        printed_any = true;
        ends_with_newline = piece.back() == '\n';
      }
      continue;
    }
    if (type == "done" && ours) {
      const double wall_ms = MsSince(t0);
      if (a.no_stream) text = m.value("text", "");
      if (a.json) {
        json out = m;
        out["client"] = {{"text", text},
                         {"chunks", chunks},
                         {"index_gaps", index_gaps},
                         {"ttft_ms", client_ttft_ms >= 0 ? json(client_ttft_ms) : json(nullptr)},
                         {"wall_ms", wall_ms}};
        PrintJson(out);
      } else {
        if (a.no_stream && !text.empty()) {
          std::fwrite(text.data(), 1, text.size(), stdout);
          printed_any = true;
          ends_with_newline = text.back() == '\n';
        }
        finish_text();
      }
      if (index_gaps > 0) {
        std::fprintf(stderr, "specnode-client: warning: %d token chunk(s) arrived out of order\n",
                     index_gaps);
      }
      if (!a.quiet && !a.json) PrintStats(m, id, client_ttft_ms, wall_ms);
      return cancel_sent ? kExitInterrupted : kExitOk;
    }
    if (type == "error" && (ours || no_id)) {
      finish_text();
      return ReportErrorReply(m, a.json);
    }
    // Anything else (another id, a late reply) is not ours: ignore it.
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  try {
    Args a = ParseArgs(argc, argv);
    if (a.command == "submit") return RunSubmit(a);
    if (a.command == "stats") return RunStats(a);
    if (a.command == "health") return RunHealth(a);
    return RunCancel(a);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "specnode-client: %s (see --help)\n", e.message.c_str());
    return kExitUsage;
  }
}

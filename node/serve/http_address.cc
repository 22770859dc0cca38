#include "node/serve/http_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace specnode {
namespace {

bool ParsePort(const std::string& text, int* port) {
  return !text.empty() && absl::SimpleAtoi(text, port) && *port >= 0 && *port <= 65535;
}

bool IsIpv4(const std::string& host) {
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1;
}

}  // namespace

absl::StatusOr<HttpAddress> ParseHttpAddress(const std::string& text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP address \"", text,
                     "\": expected PORT (on 127.0.0.1) or HOST:PORT with an IPv4 HOST, e.g. "
                     "8000 or 0.0.0.0:8000"));
  };
  HttpAddress a;
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) {
    a.host = "127.0.0.1";
    if (!ParsePort(text, &a.port)) return bad();
    return a;
  }
  a.host = std::string(text.substr(0, colon));
  if (a.host == "localhost") a.host = "127.0.0.1";
  if (!IsIpv4(a.host) || !ParsePort(text.substr(colon + 1), &a.port)) return bad();
  return a;
}

absl::StatusOr<HttpAddress> ParseMetricsAddress(const std::string& text) {
  const size_t colon = text.rfind(':');
  HttpAddress a;
  if (colon == std::string::npos || !IsIpv4(a.host = std::string(text.substr(0, colon))) ||
      !ParsePort(text.substr(colon + 1), &a.port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", text, "\": expected IPV4:PORT, e.g. 127.0.0.1:9464"));
  }
  return a;
}

absl::Status ValidateMetricsAddress(const std::string& address) {
  return ParseMetricsAddress(address).status();
}

absl::StatusOr<std::optional<HttpAddress>> ParseHttpBind(const std::string& text) {
  if (text.empty() || text == "off") return std::optional<HttpAddress>();
  absl::StatusOr<HttpAddress> a = ParseHttpAddress(text);
  if (!a.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(a.status().message(), ", or \"off\""));
  }
  return std::optional<HttpAddress>(*a);
}

}  // namespace specnode

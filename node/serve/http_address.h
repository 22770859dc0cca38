// Addresses of the node's HTTP listeners, checked where a config or flag is read.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace specnode {

struct HttpAddress {
  std::string host;  // an IPv4 literal ("127.0.0.1", "0.0.0.0")
  int port = 0;      // 0 = any free port (the server reports the one it got)
  std::string text() const { return host + ":" + std::to_string(port); }
};

// serve.http_bind: "PORT" (loopback: 127.0.0.1), "HOST:PORT" with HOST an IPv4 literal or
// "localhost"; PORT 0..65535. InvalidArgument saying what is expected otherwise.
absl::StatusOr<HttpAddress> ParseHttpAddress(const std::string& text);

// serve.http_bind / --http-bind as a setting: "off" or "" = no API listener (nullopt),
// anything else as ParseHttpAddress.
absl::StatusOr<std::optional<HttpAddress>> ParseHttpBind(const std::string& text);

// serve.metrics_bind: strictly "IPV4:PORT" (e.g. 127.0.0.1:9464).
absl::StatusOr<HttpAddress> ParseMetricsAddress(const std::string& text);
absl::Status ValidateMetricsAddress(const std::string& address);

}  // namespace specnode

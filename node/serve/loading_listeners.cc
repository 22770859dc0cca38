#include "node/serve/loading_listeners.h"

#include <httplib.h>

#include <chrono>
#include <string>

#include "model/status_macros.h"
#include "nlohmann/json.hpp"
#include "node/serve/serve_node.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<LoadingListeners>> LoadingListeners::Start(const ServeConfig& cfg) {
  std::unique_ptr<LoadingListeners> l(new LoadingListeners());
  // The ZeroMQ endpoint first: it is the default front end, and a taken one fails the start.
  LoadingZmqOptions zo;
  zo.endpoint = cfg.bind;
  zo.curve_secret_key = cfg.curve_secret_key;
  zo.model_name = ServedModelNames(cfg)[0];
  zo.limits = cfg.limits;
  SPECNODE_ASSIGN_OR_RETURN(l->zmq_, LoadingZmq::Start(zo));
  const auto started = std::chrono::steady_clock::now();
  HttpServerOptions o;
  o.threads = 2;
  o.health = [started, name = ServedModelNames(cfg)[0]] {
    const double uptime =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const nlohmann::json j = {{"status", "loading"}, {"model", name}, {"uptime_s", uptime}};
    return HealthReply{503, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                       RequestError::kUnavailable};
  };
  if (!cfg.metrics_bind.empty()) {
    HttpServerOptions mo = o;
    SPECNODE_ASSIGN_OR_RETURN(mo.address, ParseMetricsAddress(cfg.metrics_bind));
    mo.name = "metrics endpoint";
    if (mo.address.port != 0) {
      SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<HttpServer> s, HttpServer::Start(mo));
      l->servers_.push_back(std::move(s));
    }
  }
  if (cfg.http_bind.has_value() && cfg.http_bind->port != 0) {
    HttpServerOptions ao = o;
    ao.address = *cfg.http_bind;
    ao.name = "HTTP API endpoint";
    ao.routes = [](HttpRouter& r) {
      const auto loading = [](httplib::Response& res) {
        SetHttpError(res, RequestError::kUnavailable, "the model is loading; retry shortly");
        res.set_header("Retry-After", "5");
      };
      r.Get("/v1/models",
            [loading](const httplib::Request&, httplib::Response& res) { loading(res); });
      for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
        r.Post(path, [loading](const httplib::Request&, const std::string&,
                               httplib::Response& res) { loading(res); });
      }
    };
    SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<HttpServer> s, HttpServer::Start(ao));
    l->servers_.push_back(std::move(s));
  }
  return l;
}

}  // namespace specnode

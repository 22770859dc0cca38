// specnode error-codes: the node's error codes (coordinator/request_error.h), the one table
// docs/protocol.md, the Python client (client/error_codes.json) and the HTTP API follow.
#include <cstdio>
#include <string>

#include "coordinator/request_error.h"
#include "nlohmann/json.hpp"
#include "node/cli/cli_args.h"
#include "node/cli/commands.h"

namespace specnode {

int RunErrorCodes(int argc, char** argv) {
  constexpr char kHelp[] =
      "usage: specnode error-codes [--json]\n"
      "Lists the error codes of the node's replies: code, HTTP status of the OpenAI-compatible\n"
      "front, meaning. --json writes client/error_codes.json's content.\n";
  auto args = CliArgs::Parse(argc, argv, {}, {"json", "help"});
  if (!args.ok()) {
    std::fprintf(stderr, "specnode error-codes: %s\n%s",
                 std::string(args.status().message()).c_str(), kHelp);
    return 2;
  }
  if (args->Has("help")) {
    std::printf("%s", kHelp);
    return 0;
  }
  if (args->Has("json")) {
    nlohmann::ordered_json codes = nlohmann::ordered_json::object();
    for (const RequestErrorInfo& e : RequestErrorTable()) {
      codes[e.wire] = {{"http", e.http}, {"meaning", e.meaning}};
    }
    std::printf("%s\n", codes.dump(2).c_str());
    return 0;
  }
  for (const RequestErrorInfo& e : RequestErrorTable()) {
    std::printf("%-16s %3d  %s\n", e.wire, e.http, e.meaning);
  }
  return 0;
}

}  // namespace specnode

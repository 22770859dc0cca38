#include "model/llama/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace specnode {

std::string Device::name() const { return is_cpu() ? "cpu" : absl::StrCat("cuda:", index); }

absl::StatusOr<Device> ParseDevice(std::string_view text) {
  if (text == "cpu") return Device::Cpu();
  int n = -1;
  // Digits only after "cuda:" (SimpleAtoi alone would take a sign or spaces).
  const std::string_view digits = text.substr(std::min<size_t>(5, text.size()));
  if (text.rfind("cuda:", 0) == 0 && !digits.empty() &&
      digits.find_first_not_of("0123456789") == std::string_view::npos &&
      absl::SimpleAtoi(std::string(digits), &n)) {
    return Device::Cuda(n);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected cpu or cuda:N, got \"", std::string(text), "\""));
}

}  // namespace specnode

#include "tensor/device.h"

#include <charconv>
#include <stdexcept>

namespace ringtrain {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  constexpr std::string_view kPrefix = "cuda:";
  if (text.substr(0, kPrefix.size()) == kPrefix) {
    std::string_view digits = text.substr(kPrefix.size());
    int index = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0 && !digits.empty())
      return cuda(index);
  }
  throw std::invalid_argument("Device::parse: cannot parse device '" + std::string(text) +
                              "'; expected 'cpu', 'cuda' or 'cuda:N' with N >= 0");
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& os, const Device& device) { return os << device.str(); }

}  // namespace ringtrain

// device.h: where a tensor's (or a collective buffer's) memory lives.
//
// defines: DeviceType, Device ("cpu", "cuda", "cuda:N"), parse/print.
#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <string_view>

namespace ringtrain {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; always 0 for the CPU

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  // Parses "cpu", "cuda" (= cuda:0) and "cuda:N". Throws std::invalid_argument naming the string.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  std::string str() const;  // "cpu" or "cuda:N"

  friend bool operator==(const Device& a, const Device& b) {
    return a.type == b.type && a.index == b.index;
  }
};

std::ostream& operator<<(std::ostream& os, const Device& device);

}  // namespace ringtrain

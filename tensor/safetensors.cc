// safetensors.cc: reader and writer for the safetensors format (see safetensors.h).
// The JSON header is parsed and produced with nlohmann-json.
#include "tensor/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <limits>
#include <set>

#include "tensor/checks.h"

namespace ringtrain {

namespace {
constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the Python reader's limit too

// Closes a file descriptor when it goes out of scope.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// What syncs the directory after the rename: ::fsync, or a test's stand-in.
std::atomic<DirectoryFsync> directory_fsync{&::fsync};
// What closes the temporary file: ::close, or a test's stand-in.
std::atomic<FileClose> file_close{&::close};

void write_all(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t written = ::write(fd, data, n);
    if (written < 0 && errno == EINTR) continue;
    RT_CHECK(written > 0, "write_file_atomically: writing ", path, " failed: ", std::strerror(errno));
    data += written;
    n -= static_cast<size_t>(written);
  }
}
}  // namespace

void write_file_atomically(const std::string& path, const std::string& bytes) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string temp = (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  {
    FileDescriptor fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    RT_CHECK(fd.get() >= 0, "write_file_atomically: cannot create ", temp, ": ", std::strerror(errno),
             " (does the directory exist and is it writable?)");
    try {
      write_all(fd.get(), bytes.data(), bytes.size(), temp);
      RT_CHECK(::fsync(fd.get()) == 0, "write_file_atomically: fsync of ", temp, " failed: ",
               std::strerror(errno));
      // Inside the try: a failed close (EIO from a network file system, say) must not leave
      // the temporary file behind either. The descriptor is released first: after close()
      // returns, even with an error, it is gone and must not be closed again.
      RT_CHECK(file_close.load()(fd.release()) == 0, "write_file_atomically: close of ", temp,
               " failed: ", std::strerror(errno), " (", path, " was left unchanged)");
    } catch (...) {
      ::unlink(temp.c_str());
      throw;
    }
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(temp.c_str());
    RT_CHECK(false, "write_file_atomically: rename ", temp, " -> ", path, " failed: ", std::strerror(err));
  }
  // Make the rename itself durable: until the directory is synced, a crash or power
  // loss may bring back the previous file (or none). A failure here is reported, not
  // swallowed: the caller would otherwise count on a file that may not be there after a
  // crash (a checkpoint taken before a requeue, say). The new file is in place by now,
  // so the message says that too. EINVAL / ENOTSUP are file systems that cannot sync a
  // directory at all (some FUSE and network ones): there is nothing more to do there.
  const auto not_durable = [&](const char* step, int err) {
    return Error(detail::concat("write_file_atomically: ", path, " was written and renamed into place, but ",
                                step, " of its directory ", dir.string(), " failed: ", std::strerror(err),
                                "; the rename is not durable (after a crash or power loss the previous file, or "
                                "none, may be found there). Check the file system (dmesg, free space, "
                                "permissions to read the directory) and save again"));
  };
  FileDescriptor dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() < 0) throw not_durable("opening", errno);
  if (directory_fsync.load()(dir_fd.get()) != 0) {
    const int err = errno;
    if (err != EINVAL && err != ENOTSUP && err != EOPNOTSUPP) throw not_durable("fsync", err);
  }
}

DirectoryFsync set_directory_fsync_for_testing(DirectoryFsync fsync_fn) {
  return directory_fsync.exchange(fsync_fn != nullptr ? fsync_fn : &::fsync);
}

FileClose set_file_close_for_testing(FileClose close_fn) {
  return file_close.exchange(close_fn != nullptr ? close_fn : &::close);
}

const char* safetensors_dtype_code(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "F32";
    case DType::kFloat64: return "F64";
    case DType::kFloat16: return "F16";
    case DType::kBFloat16: return "BF16";
    case DType::kInt32: return "I32";
    case DType::kInt64: return "I64";
  }
  return "?";
}

DType dtype_from_safetensors_code(const std::string& code) {
  for (DType dtype : kAllDTypes)
    if (code == safetensors_dtype_code(dtype)) return dtype;
  throw Error("safetensors: unsupported dtype '" + code +
              "' (ringtrain reads F32, F64, F16, BF16, I32, I64)");
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [key, tensor] : tensors)
    if (key == name) return tensor;
  std::string keys;
  for (const auto& entry : tensors) keys += (keys.empty() ? "" : ", ") + entry.first;
  throw Error("safetensors: no tensor named '" + name + "' (file has: " + keys + ")");
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  std::vector<Tensor> host;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    RT_CHECK(!name.empty() && name != "__metadata__", "save_safetensors: invalid tensor name '", name,
             "' for ", path);
    RT_CHECK(names.insert(name).second, "save_safetensors: duplicate tensor name '", name, "' for ", path);
    RT_CHECK(tensor.defined(), "save_safetensors: tensor '", name, "' is undefined");
    Tensor contiguous = tensor.to(Device::cpu()).contiguous();
    uint64_t nbytes = contiguous.nbytes();
    header[name] = {{"dtype", safetensors_dtype_code(tensor.dtype())},
                    {"shape", tensor.shape()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    host.push_back(std::move(contiguous));
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // keep the data 8-byte aligned, as safetensors does
  std::string bytes(8, '\0');
  uint64_t header_size = json.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header_size >> (8 * i)) & 0xff);
  bytes += json;
  bytes.reserve(bytes.size() + offset);
  for (const Tensor& t : host)
    if (t.numel() > 0) bytes.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  write_file_atomically(path, bytes);
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RT_CHECK(in.good(), "load_safetensors: cannot open ", path, ": ", std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto fail = [&](const std::string& what) -> Error {
    return Error("load_safetensors: " + path + " is not a valid safetensors file: " + what);
  };
  if (bytes.size() < 8) throw fail("only " + std::to_string(bytes.size()) + " bytes (truncated?)");
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  if (header_size > kMaxHeaderBytes || header_size > bytes.size() - 8)
    throw fail("header length " + std::to_string(header_size) + " exceeds the file size " +
               std::to_string(bytes.size()) + " (truncated or corrupt)");
  nlohmann::ordered_json header;
  // The JSON parser keeps only the last value of a repeated key, which would leave the
  // other one's bytes as an unexplained gap: name the duplicate instead.
  std::set<std::string> top_level_keys;
  std::string duplicate_key;
  auto on_event = [&](int depth, nlohmann::ordered_json::parse_event_t event,
                      nlohmann::ordered_json& parsed) {
    if (event == nlohmann::ordered_json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !top_level_keys.insert(parsed.get<std::string>()).second && duplicate_key.empty())
      duplicate_key = parsed.get<std::string>();
    return true;
  };
  try {
    header = nlohmann::ordered_json::parse(bytes.begin() + 8, bytes.begin() + 8 + header_size, on_event);
  } catch (const nlohmann::json::exception& e) {
    throw fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw fail("header is not a JSON object");
  if (!duplicate_key.empty())
    throw fail("the header names '" + duplicate_key + "' more than once (duplicate tensor name)");
  const uint64_t data_size = bytes.size() - 8 - header_size;
  const char* data = bytes.data() + 8 + header_size;

  SafetensorsFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) throw fail("__metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string()) throw fail("__metadata__ value for '" + m.key() + "' is not a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    try {
      DType dtype = dtype_from_safetensors_code(entry.at("dtype").get<std::string>());
      // Dims and offsets are read one by one: nlohmann's get<> would truncate 4.5 to 4, make a
      // negative offset huge, and cast 1e30 or 2^64-1 to int64 (undefined / negative).
      auto integers = [&](const char* field, bool is_shape) {
        const auto& array = entry.at(field);
        if (!array.is_array()) throw fail("tensor '" + name + "' " + field + " is not a JSON array");
        std::vector<uint64_t> values;
        for (const auto& v : array) {
          const std::string what = "tensor '" + name + "' " + field + " entry " + v.dump();
          if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)
            throw fail(what + (is_shape ? " is a negative dim" : " is negative"));
          if (v.is_number_float()) {
            const double f = v.get<double>();
            const bool whole = std::isfinite(f) && f == std::floor(f);
            throw fail(what + (whole ? " is too large (or is written as a float; use a JSON integer)"
                                     : " is not an integer"));
          }
          if (!v.is_number_integer()) throw fail(what + " is not an integer");
          const uint64_t u = v.get<uint64_t>();
          if (is_shape && u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
            throw fail(what + " is too large for a dim (more than 2^63 - 1)");
          values.push_back(u);
        }
        return values;
      };
      Shape shape;
      for (uint64_t u : integers("shape", true)) shape.push_back(static_cast<int64_t>(u));
      std::vector<uint64_t> offsets = integers("data_offsets", false);
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size)
        throw fail("tensor '" + name + "' has data_offsets outside the " + std::to_string(data_size) +
                   "-byte data section (truncated?)");
      // The byte count, checked for overflow: a shape whose product wraps around (to 0, say)
      // would otherwise match a short or empty range and claim storage it does not have.
      std::optional<uint64_t> bytes = checked_byte_count(shape, dtype_size(dtype));
      if (!bytes)
        throw fail("tensor '" + name + "' " + dtype_name(dtype) + shape_str(shape) +
                   " is too large (its byte count overflows 63 bits)");
      const uint64_t expected = *bytes;
      if (offsets[1] - offsets[0] != expected)
        throw fail("tensor '" + name + "' " + dtype_name(dtype) + shape_str(shape) + " needs " +
                   std::to_string(expected) + " bytes but its offsets span " +
                   std::to_string(offsets[1] - offsets[0]));
      ranges.emplace_back(offsets[0], offsets[1]);
      Tensor t = Tensor::empty(shape, dtype);
      if (expected > 0) std::memcpy(t.data_ptr(), data + offsets[0], expected);
      file.tensors.emplace_back(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      throw fail("entry '" + name + "' is malformed: " + e.what());
    } catch (const Error& e) {
      if (std::string(e.what()).rfind("load_safetensors", 0) == 0) throw;
      throw fail("entry '" + name + "': " + e.what());
    }
  }
  // The tensors must tile the data section exactly, as the format requires.
  std::sort(ranges.begin(), ranges.end());
  uint64_t expected_begin = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != expected_begin) throw fail("tensor data regions overlap or leave gaps");
    expected_begin = end;
  }
  if (expected_begin != data_size)
    throw fail(std::to_string(data_size - expected_begin) + " trailing bytes after the last tensor");
  return file;
}

}  // namespace ringtrain

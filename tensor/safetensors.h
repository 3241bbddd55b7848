// safetensors.h: tensors to and from .safetensors files, the format Python's
// `safetensors` package reads and writes (so weights move between ringtrain and
// PyTorch: safetensors.torch.load_file / save_file).
//
// File layout: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "string value"}}
// (padded with spaces to a multiple of 8), then the raw little-endian,
// row-major bytes of every tensor, offsets relative to the end of the header.
//
// Writes are atomic: a temporary file beside the target, fsync, rename, fsync of
// the directory. A reader never sees a half-written file, and a crash during a
// save leaves the previous file intact.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace ringtrain {

struct SafetensorsFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order
  std::map<std::string, std::string> metadata;          // "__metadata__"

  // The tensor called `name`; throws naming the missing key and the keys present.
  const Tensor& at(const std::string& name) const;
};

// Saves tensors (any device, any strides: copied to host contiguous) to `path`
// atomically. Names must be unique and non-empty.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Loads every tensor onto the CPU. A truncated or corrupt file (bad header size,
// malformed JSON, unknown dtype, offsets out of range or overlapping, a size that
// does not match its shape) throws ringtrain::Error naming the file and the problem.
SafetensorsFile load_safetensors(const std::string& path);

// The safetensors dtype code ("F32", "BF16", ...) and back.
const char* safetensors_dtype_code(DType dtype);
DType dtype_from_safetensors_code(const std::string& code);

// Writes `bytes` to `path` atomically (temp file + fsync + rename + directory fsync).
// Used for safetensors and for the JSON sidecars of checkpoints. Throws ringtrain::Error
// when any step fails; when only the directory fsync fails (the rename is done but not
// durable), the message says the new file is in place but may not survive a crash.
// A file system that cannot sync directories at all (fsync gives EINVAL or ENOTSUP) is
// accepted silently: nothing more can be done there.
void write_file_atomically(const std::string& path, const std::string& bytes);

// For tests: the function write_file_atomically calls to fsync the directory after the
// rename (::fsync by default; nullptr puts ::fsync back). Returns the previous one.
using DirectoryFsync = int (*)(int fd);
DirectoryFsync set_directory_fsync_for_testing(DirectoryFsync fsync_fn);

// For tests: the function write_file_atomically closes the temporary file with (::close by
// default; nullptr puts ::close back). Returns the previous one.
using FileClose = int (*)(int fd);
FileClose set_file_close_for_testing(FileClose close_fn);

}  // namespace ringtrain

// file_reader.cc: read_file_maybe_gzip over zlib's gz* stream API.
//
// gzopen/gzread transparently pass through files that are not gzip, so one code
// path serves both. A truncated .gz stream is not an error gzread reports by its
// return value (it returns the bytes it could inflate), so after the last read
// we ask gzerror() and turn anything but Z_OK into an exception.
#include "nn/data/file_reader.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <sys/stat.h>

namespace ringtrain::data {
namespace {

// Owns a gzFile; closes it on every path out of read_file_maybe_gzip.
struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFilePtr = std::unique_ptr<gzFile_s, GzCloser>;

}  // namespace

std::string read_file_maybe_gzip(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw FileFormatError(path, std::string("cannot open: ") + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) throw FileFormatError(path, "is a directory, expected a file");

  errno = 0;
  GzFilePtr file(gzopen(path.c_str(), "rb"));
  if (!file) {
    throw FileFormatError(path, std::string("cannot open: ") +
                                    (errno ? std::strerror(errno) : "zlib could not allocate a stream"));
  }
  gzbuffer(file.get(), 1 << 17);

  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));  // a lower bound for compressed files
  constexpr unsigned kChunk = 1 << 20;
  for (;;) {
    size_t old = out.size();
    out.resize(old + kChunk);
    int n = gzread(file.get(), out.data() + old, kChunk);
    if (n < 0) {
      int errnum = Z_OK;
      const char* msg = gzerror(file.get(), &errnum);
      throw FileFormatError(path, std::string("read error: ") + (msg ? msg : "unknown zlib error"));
    }
    out.resize(old + static_cast<size_t>(n));
    if (n == 0) break;
  }
  int errnum = Z_OK;
  const char* msg = gzerror(file.get(), &errnum);
  if (errnum == Z_BUF_ERROR) {
    throw FileFormatError(path, "truncated gzip stream (unexpected end of file); download it again");
  }
  if (errnum != Z_OK) {
    throw FileFormatError(path, std::string("corrupt gzip stream: ") + (msg ? msg : "unknown zlib error"));
  }
  return out;
}

}  // namespace ringtrain::data

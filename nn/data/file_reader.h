// file_reader.h: whole-file reads that accept plain or gzip-compressed files.
//
// defines: read_file_maybe_gzip(), FileFormatError.
//
// Data sets arrive both ways: MNIST is usually downloaded as *.gz, sometimes
// already unpacked; sklearn ships digits.csv.gz. zlib's gz* functions read both
// (a file without the gzip magic is passed through unchanged), so callers never
// need to know. zlib stays a private dependency of ringtrain_nn: this header
// names none of its symbols.
//
// Every failure throws FileFormatError whose message starts with the file's
// path, so a user who points a loader at the wrong place learns which file and
// what was wrong with it ("cannot open", "truncated gzip stream", ...).
#pragma once

#include <string>

#include "tensor/checks.h"

namespace ringtrain::data {

// A data file that is missing, unreadable or malformed. what() names the file.
class FileFormatError : public Error {
 public:
  FileFormatError(const std::string& path, const std::string& problem)
      : Error(path + ": " + problem), path_(path) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The decompressed bytes of `path` (gzip or plain). Throws FileFormatError when
// the file cannot be opened or the gzip stream is truncated or corrupt.
std::string read_file_maybe_gzip(const std::string& path);

}  // namespace ringtrain::data

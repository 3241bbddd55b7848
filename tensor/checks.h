// checks.h: the one place where ringtrain turns error codes into exceptions.
//
// defines: RT_CHECK (argument/invariant checks in our own code), and one check
// macro per external library: CUDA_CHECK, CUBLAS_CHECK, CUDNN_CHECK, NCCL_CHECK,
// MPI_CHECK, SYS_CHECK (POSIX calls returning -1 with errno).
//
// The library macros name no library symbol until they are expanded, so this
// header includes none of those libraries: a file that uses CUDA_CHECK includes
// <cuda_runtime.h> itself. Every macro throws ringtrain::Error (a
// std::runtime_error) whose message holds the failing expression, the library's
// own error string, and file:line. Library code never calls exit().
#pragma once

#include <cerrno>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>

namespace ringtrain {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] inline void throw_error(const char* library, const char* expr, const std::string& what,
                                     const char* file, int line) {
  std::ostringstream os;
  os << library << " error: " << what << " (in `" << expr << "` at " << file << ":" << line << ")";
  throw Error(os.str());
}
// Streams every argument into one string: RT_CHECK(a == b, "matmul: ", shape_a, " vs ", shape_b).
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
// Inside a catch (...): what the exception being handled says, also when it is no
// std::exception (a user's callback may throw anything), for a message to peers.
inline std::string current_exception_what() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}
}  // namespace detail

}  // namespace ringtrain

// Throws ringtrain::Error with the streamed message when `cond` is false.
#define RT_CHECK(cond, ...)                                                     \
  do {                                                                          \
    if (!(cond)) throw ::ringtrain::Error(::ringtrain::detail::concat(__VA_ARGS__)); \
  } while (0)

#define CUDA_CHECK(expr)                                                                 \
  do {                                                                                   \
    cudaError_t rt_status_ = (expr);                                                     \
    if (rt_status_ != cudaSuccess)                                                       \
      ::ringtrain::detail::throw_error("CUDA", #expr, cudaGetErrorString(rt_status_),     \
                                       __FILE__, __LINE__);                              \
  } while (0)

#define CUBLAS_CHECK(expr)                                                               \
  do {                                                                                   \
    cublasStatus_t rt_status_ = (expr);                                                  \
    if (rt_status_ != CUBLAS_STATUS_SUCCESS)                                             \
      ::ringtrain::detail::throw_error("cuBLAS", #expr, cublasGetStatusString(rt_status_), \
                                       __FILE__, __LINE__);                              \
  } while (0)

#define CUDNN_CHECK(expr)                                                                \
  do {                                                                                   \
    cudnnStatus_t rt_status_ = (expr);                                                   \
    if (rt_status_ != CUDNN_STATUS_SUCCESS)                                              \
      ::ringtrain::detail::throw_error("cuDNN", #expr, cudnnGetErrorString(rt_status_),   \
                                       __FILE__, __LINE__);                              \
  } while (0)

#define NCCL_CHECK(expr)                                                                 \
  do {                                                                                   \
    ncclResult_t rt_status_ = (expr);                                                    \
    if (rt_status_ != ncclSuccess)                                                       \
      ::ringtrain::detail::throw_error("NCCL", #expr, ncclGetErrorString(rt_status_),     \
                                       __FILE__, __LINE__);                              \
  } while (0)

#define MPI_CHECK(expr)                                                                  \
  do {                                                                                   \
    int rt_status_ = (expr);                                                             \
    if (rt_status_ != MPI_SUCCESS) {                                                     \
      char rt_msg_[MPI_MAX_ERROR_STRING];                                                \
      int rt_len_ = 0;                                                                   \
      MPI_Error_string(rt_status_, rt_msg_, &rt_len_);                                   \
      ::ringtrain::detail::throw_error("MPI", #expr, std::string(rt_msg_, rt_len_),      \
                                       __FILE__, __LINE__);                              \
    }                                                                                    \
  } while (0)

// For POSIX calls that return -1 and set errno.
#define SYS_CHECK(expr)                                                                  \
  do {                                                                                   \
    if ((expr) == -1)                                                                    \
      ::ringtrain::detail::throw_error("system", #expr, std::strerror(errno), __FILE__,  \
                                       __LINE__);                                        \
  } while (0)

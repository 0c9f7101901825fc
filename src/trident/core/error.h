// Errors with context. Bad input (flags, files, layouts) throws InvalidArgument or DataError with a
// message that names the culprit and the fix; broken invariants (bugs) throw InternalError. Library
// code never calls exit/abort: the one catch is in main, which ends the whole job.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace trident::core {

// Concatenates streamable values: str("got ", n, " rows") == "got 3 rows".
template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A flag, config value or API argument is wrong.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};
// A file (dataset, tokenizer, checkpoint) is missing, corrupt or foreign.
class DataError : public Error {
 public:
  using Error::Error;
};
// The feature is not built in (e.g. no CUDA in this build).
class Unavailable : public Error {
 public:
  using Error::Error;
};
// A collective failed or timed out.
class CommError : public Error {
 public:
  using Error::Error;
};
// A broken invariant: a bug in trident.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void fail_check(const char* file, int line, const char* cond, const std::string& msg);
[[noreturn]] void fail_assert(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace trident::core

// Guards user input: throws InvalidArgument("msg (check `cond` failed at file:line)").
// The message arguments are evaluated only on failure.
#define TRIDENT_CHECK(cond, ...)                                              \
  do {                                                                        \
    if (!(cond)) [[unlikely]]                                                 \
      ::trident::core::detail::fail_check(__FILE__, __LINE__, #cond,          \
                                          ::trident::core::str(__VA_ARGS__)); \
  } while (0)

// Guards invariants: throws InternalError, marked as a bug.
#define TRIDENT_ASSERT(cond, ...)                                              \
  do {                                                                         \
    if (!(cond)) [[unlikely]]                                                  \
      ::trident::core::detail::fail_assert(__FILE__, __LINE__, #cond,          \
                                           ::trident::core::str(__VA_ARGS__)); \
  } while (0)

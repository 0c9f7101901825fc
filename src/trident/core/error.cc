// Out-of-line failure paths of TRIDENT_CHECK / TRIDENT_ASSERT.
#include "trident/core/error.h"

#include <cstring>

namespace trident::core::detail {

namespace {
const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

void fail_check(const char* file, int line, const char* cond, const std::string& msg) {
  throw InvalidArgument(str(msg, " [", basename_of(file), ":", line, ": ", cond, "]"));
}

void fail_assert(const char* file, int line, const char* cond, const std::string& msg) {
  throw InternalError(str("internal error (a bug, please report it): ", msg, " [",
                          basename_of(file), ":", line, ": ", cond, "]"));
}

}  // namespace trident::core::detail

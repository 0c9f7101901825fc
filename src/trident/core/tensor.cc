#include "trident/core/tensor.h"

#include <sstream>

namespace trident::core {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU16:
      return "u16";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& os, const Shape& s) {
  os << '(';
  for (int i = 0; i < s.rank; ++i) os << (i ? ", " : "") << s[i];
  return os << ')';
}

std::string to_string(const Shape& s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

}  // namespace trident::core

// Names, conversions and the element-wise reduction used by the in-process communicators.
#include "trident/comm/datatype.h"

#include <algorithm>

namespace trident::comm {

const char* datatype_name(Datatype t) {
  switch (t) {
    case Datatype::kF32:
      return "f32";
    case Datatype::kF64:
      return "f64";
    case Datatype::kBF16:
      return "bf16";
    case Datatype::kF16:
      return "f16";
    case Datatype::kI32:
      return "i32";
    case Datatype::kI64:
      return "i64";
    case Datatype::kU16:
      return "u16";
    case Datatype::kU8:
      return "u8";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

bool is_reducible(Datatype t) { return t != Datatype::kBF16 && t != Datatype::kF16; }

Datatype to_datatype(core::DType t) {
  switch (t) {
    case core::DType::kF32:
      return Datatype::kF32;
    case core::DType::kBF16:
      return Datatype::kBF16;
    case core::DType::kF16:
      return Datatype::kF16;
    case core::DType::kI32:
      return Datatype::kI32;
    case core::DType::kI64:
      return Datatype::kI64;
    case core::DType::kU16:
      return Datatype::kU16;
  }
  TRIDENT_ASSERT(false, "to_datatype: unhandled core::DType ", static_cast<int>(t));
  return Datatype::kU8;
}

namespace {

template <class T>
void reduce_typed(void* acc, const void* in, std::int64_t count, ReduceOp op) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(in);
  switch (op) {
    case ReduceOp::kSum:
      for (std::int64_t i = 0; i < count; ++i) a[i] = static_cast<T>(a[i] + b[i]);
      return;
    case ReduceOp::kMax:
      for (std::int64_t i = 0; i < count; ++i) a[i] = std::max(a[i], b[i]);
      return;
    case ReduceOp::kMin:
      for (std::int64_t i = 0; i < count; ++i) a[i] = std::min(a[i], b[i]);
      return;
  }
}

}  // namespace

void reduce_into(void* acc, const void* in, std::int64_t count, Datatype t, ReduceOp op) {
  switch (t) {
    case Datatype::kF32:
      return reduce_typed<float>(acc, in, count, op);
    case Datatype::kF64:
      return reduce_typed<double>(acc, in, count, op);
    case Datatype::kI32:
      return reduce_typed<std::int32_t>(acc, in, count, op);
    case Datatype::kI64:
      return reduce_typed<std::int64_t>(acc, in, count, op);
    case Datatype::kU16:
      return reduce_typed<std::uint16_t>(acc, in, count, op);
    case Datatype::kU8:
      return reduce_typed<std::uint8_t>(acc, in, count, op);
    case Datatype::kBF16:
    case Datatype::kF16:
      break;
  }
  TRIDENT_ASSERT(false, "reduce_into: ", datatype_name(t), " is not reducible");
}

}  // namespace trident::comm

// Element types and reduction operators that a Communicator moves and combines.
// comm keeps its own Datatype because collectives also need f64 (gradient-norm partial sums, loss
// sums), which core::DType does not have; every core::DType converts with to_datatype().
#pragma once

#include <cstdint>
#include <string>

#include "trident/core/bf16.h"
#include "trident/core/tensor.h"

namespace trident::comm {

enum class Datatype : std::uint8_t { kF32, kF64, kBF16, kF16, kI32, kI64, kU16, kU8 };

// sum, max and min are defined for f32, f64, i32, i64, u16 and u8. bf16 and f16 can be moved
// (all_gather, broadcast, send/recv) but not reduced: reduce in f32 instead (STYLE §2.8).
enum class ReduceOp : std::uint8_t { kSum, kMax, kMin };

constexpr std::int64_t size_of(Datatype t) {
  switch (t) {
    case Datatype::kF32:
      return 4;
    case Datatype::kF64:
      return 8;
    case Datatype::kBF16:
      return 2;
    case Datatype::kF16:
      return 2;
    case Datatype::kI32:
      return 4;
    case Datatype::kI64:
      return 8;
    case Datatype::kU16:
      return 2;
    case Datatype::kU8:
      return 1;
  }
  return 0;
}
const char* datatype_name(Datatype t);
const char* reduce_op_name(ReduceOp op);
// True when ReduceOp applies to `t` (every type except bf16 and f16).
bool is_reducible(Datatype t);

Datatype to_datatype(core::DType t);

// Datatype of a C++ element type: datatype_of<float>() == Datatype::kF32.
template <class T>
constexpr Datatype datatype_of();
template <>
constexpr Datatype datatype_of<float>() {
  return Datatype::kF32;
}
template <>
constexpr Datatype datatype_of<double>() {
  return Datatype::kF64;
}
template <>
constexpr Datatype datatype_of<core::bf16>() {
  return Datatype::kBF16;
}
template <>
constexpr Datatype datatype_of<std::int32_t>() {
  return Datatype::kI32;
}
template <>
constexpr Datatype datatype_of<std::int64_t>() {
  return Datatype::kI64;
}
template <>
constexpr Datatype datatype_of<std::uint16_t>() {
  return Datatype::kU16;
}
template <>
constexpr Datatype datatype_of<std::uint8_t>() {
  return Datatype::kU8;
}

// Combines `count` elements: acc[i] = op(acc[i], in[i]). Used by the in-process communicators;
// `t` must be reducible.
void reduce_into(void* acc, const void* in, std::int64_t count, Datatype t, ReduceOp op);

}  // namespace trident::comm

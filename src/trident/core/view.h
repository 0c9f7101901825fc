// Making a TensorView of existing memory (kernel arguments are views: kernels/linear.h).
#pragma once

#include "trident/core/tensor.h"

namespace trident::core {

// A view of `p` (dtype from T) with `shape` on `device`. Views do not carry constness: a kernel's
// contract says which of its views it writes.
template <class T>
TensorView view(const T* p, Shape shape, Device device = {}) {
  return {.data = const_cast<T*>(p), .dtype = dtype_of<T>(), .device = device, .shape = shape};
}

}  // namespace trident::core

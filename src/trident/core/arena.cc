#include "trident/core/arena.h"

#include <cstdlib>
#include <cstring>

namespace trident::core {

void Arena::Free::operator()(void* p) const { std::free(p); }

Arena::Arena(std::int64_t capacity_bytes, Device device) : device_(device) {
  TRIDENT_CHECK(device.kind == DeviceKind::kCpu, "Arena: only CPU memory is supported so far");
  TRIDENT_ASSERT(capacity_bytes >= 0, "negative arena size ", capacity_bytes);
  capacity_ = (capacity_bytes + kAlign - 1) / kAlign * kAlign;
  if (capacity_ == 0) return;
  void* p =
      std::aligned_alloc(static_cast<std::size_t>(kAlign), static_cast<std::size_t>(capacity_));
  if (p == nullptr) {
    throw Error(str("out of memory: could not allocate an arena of ", capacity_, " bytes"));
  }
  std::memset(p, 0, static_cast<std::size_t>(capacity_));
  data_.reset(p);
}

TensorView Arena::alloc(DType dtype, const Shape& shape) {
  const std::int64_t need = footprint(dtype, shape);
  TRIDENT_ASSERT(used_ + need <= capacity_, "arena overflow: need ", need, " bytes at offset ",
                 used_, " of ", capacity_);
  TensorView v;
  v.data = static_cast<char*>(data_.get()) + used_;
  v.dtype = dtype;
  v.device = device_;
  v.shape = shape;
  used_ += need;
  return v;
}

}  // namespace trident::core

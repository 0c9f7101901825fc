#include "trident/core/arena.h"

#include <cstdlib>
#include <cstring>

namespace trident::core {

namespace {

class HostMemory final : public MemoryResource {
 public:
  void* allocate(std::int64_t bytes) override {
    const auto n = static_cast<std::size_t>((bytes + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, n);
    if (p == nullptr) {
      throw Error(str("out of memory: could not allocate ", bytes, " bytes of host memory"));
    }
    return p;
  }
  void deallocate(void* p, std::int64_t) noexcept override { std::free(p); }
  void zero(void* p, std::int64_t bytes) override {
    std::memset(p, 0, static_cast<std::size_t>(bytes));
  }
  Device device() const override { return {}; }
};

}  // namespace

MemoryResource& host_memory() {
  static HostMemory host;
  return host;
}

Arena::Arena(std::int64_t capacity_bytes, MemoryResource& memory) : memory_(&memory) {
  TRIDENT_ASSERT(capacity_bytes >= 0, "negative arena size ", capacity_bytes);
  capacity_ = (capacity_bytes + kAlign - 1) / kAlign * kAlign;
  if (capacity_ == 0) return;
  data_ = memory.allocate(capacity_);
  memory.zero(data_, capacity_);
}

Arena& Arena::operator=(Arena&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) memory_->deallocate(data_, capacity_);
    memory_ = std::exchange(o.memory_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
    used_ = std::exchange(o.used_, 0);
  }
  return *this;
}

Arena::~Arena() {
  if (data_ != nullptr) memory_->deallocate(data_, capacity_);
}

TensorView Arena::alloc(DType dtype, const Shape& shape) {
  const std::int64_t need = footprint(dtype, shape);
  TRIDENT_ASSERT(used_ + need <= capacity_, "arena overflow: need ", need, " bytes at offset ",
                 used_, " of ", capacity_);
  TensorView v;
  v.data = static_cast<char*>(data_) + used_;
  v.dtype = dtype;
  v.device = device();
  v.shape = shape;
  used_ += need;
  return v;
}

}  // namespace trident::core

#include "trident/core/workspace.h"

#include "trident/core/error.h"
#include "trident/core/exec_context.h"

namespace trident::core {

void Workspace::prepare(int threads, int slots) {
  TRIDENT_ASSERT(threads > 0 && slots > 0, "Workspace::prepare(", threads, ", ", slots, ")");
  const auto t = static_cast<std::size_t>(threads), s = static_cast<std::size_t>(slots);
  if (buffers_.size() < t) {
    buffers_.resize(t);
    grown_.resize(t, 0);
    ++table_allocations_;
  }
  for (std::size_t i = 0; i < t; ++i) {
    if (buffers_[i].size() < s) {
      buffers_[i].resize(s);
      ++table_allocations_;
    }
  }
}

float* Workspace::floats(int thread, int slot, std::size_t count) {
  const auto t = static_cast<std::size_t>(thread), s = static_cast<std::size_t>(slot);
  TRIDENT_ASSERT(t < buffers_.size() && s < buffers_[t].size(), "Workspace: thread ", thread,
                 " slot ", slot, " was not prepared");
  std::vector<float>& b = buffers_[t][s];
  if (b.size() < count) {
    b.resize(count);
    ++grown_[t];
  }
  return b.data();
}

std::int64_t Workspace::allocations() const {
  std::int64_t n = table_allocations_;
  for (std::int64_t g : grown_) n += g;
  return n;
}

std::int64_t Workspace::bytes() const {
  std::int64_t n = 0;
  for (const auto& slots : buffers_)
    for (const auto& b : slots) n += static_cast<std::int64_t>(b.capacity() * sizeof(float));
  return n;
}

Workspace& ExecContext::scratch() const {
  if (workspace != nullptr) return *workspace;
  thread_local Workspace own;
  return own;
}

}  // namespace trident::core

#include "trident/core/profile.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

namespace trident::core::profile {

namespace {
std::mutex g_mu;
std::map<std::string, Entry> g_entries;
std::thread::id g_owner;
thread_local Scope* t_current = nullptr;
}  // namespace

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kGemm:
      return "GEMM";
    case Kind::kAttention:
      return "attention";
    case Kind::kMemory:
      return "memory-bound";
    case Kind::kLoss:
      return "loss";
    case Kind::kOptimizer:
      return "optimizer";
    case Kind::kComm:
      return "communication";
  }
  return "?";
}

void set_enabled(bool on) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (on) {
    g_entries.clear();
    g_owner = std::this_thread::get_id();
  }
  detail::g_enabled.store(on, std::memory_order_relaxed);
}

void reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_entries.clear();
}

std::vector<Entry> entries() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<Entry> out;
  out.reserve(g_entries.size());
  for (const auto& [key, e] : g_entries) out.push_back(e);
  std::sort(out.begin(), out.end(),
            [](const Entry& a, const Entry& b) { return a.seconds > b.seconds; });
  return out;
}

void Scope::start(Kind kind, const char* name, double flops, double bytes, std::int64_t m,
                  std::int64_t n, std::int64_t k) {
  if (std::this_thread::get_id() != g_owner) return;
  active_ = true;
  kind_ = kind;
  name_ = name;
  flops_ = flops;
  bytes_ = bytes;
  m_ = m;
  n_ = n;
  k_ = k;
  parent_ = t_current;
  t_current = this;
  t0_ = std::chrono::steady_clock::now();
}

void Scope::stop() {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  t_current = parent_;
  if (parent_ != nullptr) parent_->child_s_ += elapsed;
  char key[160];
  if (m_ >= 0) {
    std::snprintf(key, sizeof key, "%s %lldx%lldx%lld", name_, static_cast<long long>(m_),
                  static_cast<long long>(n_), static_cast<long long>(k_));
  } else {
    std::snprintf(key, sizeof key, "%s", name_);
  }
  std::lock_guard<std::mutex> lock(g_mu);
  Entry& e = g_entries[key];
  if (e.calls == 0) {
    e.name = key;
    e.kind = kind_;
  }
  ++e.calls;
  e.seconds += elapsed - child_s_;
  e.flops += flops_;
  e.bytes += bytes_;
}

}  // namespace trident::core::profile

#include "trident/core/profile.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace trident::core::profile {

namespace {
std::mutex g_mu;
std::map<std::string, Entry> g_entries;
std::thread::id g_owner;
thread_local Scope* t_current = nullptr;
std::function<void()> g_device_sync;  // set and read on the recording thread
}  // namespace

void set_device_sync(std::function<void()> sync) { g_device_sync = std::move(sync); }

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

void resume() { detail::g_enabled.store(true, std::memory_order_relaxed); }

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

std::array<Entry, kNumKinds> by_kind(const std::vector<Entry>& entries) {
  std::array<Entry, kNumKinds> kinds{};
  for (std::size_t i = 0; i < kNumKinds; ++i) {
    kinds[i].kind = static_cast<Kind>(i);
    kinds[i].name = kind_name(kinds[i].kind);
  }
  for (const Entry& e : entries) {
    Entry& k = kinds[static_cast<std::size_t>(e.kind)];
    k.calls += e.calls;
    k.seconds += e.seconds;
    k.flops += e.flops;
    k.bytes += e.bytes;
  }
  return kinds;
}

std::vector<Entry> merged(const std::vector<Entry>& a, const std::vector<Entry>& b) {
  std::map<std::string, Entry> sum;
  for (const std::vector<Entry>* list : {&a, &b}) {
    for (const Entry& e : *list) {
      Entry& s = sum[e.name];
      if (s.calls == 0) s.name = e.name, s.kind = e.kind;
      s.calls += e.calls;
      s.seconds += e.seconds;
      s.flops += e.flops;
      s.bytes += e.bytes;
    }
  }
  std::vector<Entry> out;
  out.reserve(sum.size());
  for (auto& [name, e] : sum) out.push_back(std::move(e));
  std::sort(out.begin(), out.end(),
            [](const Entry& x, const Entry& y) { return x.seconds > y.seconds; });
  return out;
}

namespace {
std::string rate(const Entry& e) {
  char buf[64] = "";
  if (e.seconds > 0 && e.flops > 0) {
    std::snprintf(buf, sizeof buf, "%.1f GFLOP/s", e.flops / e.seconds / 1e9);
  } else if (e.seconds > 0 && e.bytes > 0) {
    std::snprintf(buf, sizeof buf, "%.1f GB/s", e.bytes / e.seconds / 1e9);
  }
  return buf;
}
}  // namespace

std::string format_table(const std::vector<Entry>& entries, double steps, double step_s,
                         std::size_t top) {
  const double step_ms = step_s * 1e3;
  const double share = step_ms > 0 ? 100.0 / step_ms : 0.0;
  std::string out = "| op (GEMM: rows x out x in) | kind | calls/step | ms/step | share | rate |\n";
  out += "|---|---|---:|---:|---:|---:|\n";
  char line[320];
  double tracked_ms = 0;
  std::size_t shown = 0;
  for (const Entry& e : entries) {
    const double ms = e.seconds * 1e3 / steps;
    tracked_ms += ms;
    if (shown++ >= top) continue;
    std::snprintf(line, sizeof line, "| %s | %s | %.0f | %.1f | %.1f%% | %s |\n", e.name.c_str(),
                  kind_name(e.kind), static_cast<double>(e.calls) / steps, ms, ms * share,
                  rate(e).c_str());
    out += line;
  }
  if (shown > top) {
    std::snprintf(line, sizeof line, "| (%zu more ops) | | | | | |\n", shown - top);
    out += line;
  }
  out += "\n| kind | ms/step | share | rate |\n|---|---:|---:|---:|\n";
  for (const Entry& k : by_kind(entries)) {
    if (k.calls == 0) continue;
    const double ms = k.seconds * 1e3 / steps;
    std::snprintf(line, sizeof line, "| %s | %.1f | %.1f%% | %s |\n", k.name.c_str(), ms,
                  ms * share, rate(k).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "| not in a kernel or collective | %.1f | %.1f%% | |\n",
                step_ms - tracked_ms, (step_ms - tracked_ms) * share);
  out += line;
  std::snprintf(line, sizeof line, "| step | %.1f | 100%% | |\n", step_ms);
  out += line;
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
  if (g_device_sync) g_device_sync();  // what was queued before belongs to the enclosing scope
  t0_ = std::chrono::steady_clock::now();
}

void Scope::stop() {
  if (g_device_sync) g_device_sync();
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

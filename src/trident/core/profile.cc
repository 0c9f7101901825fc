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

// Scopes timed by the device timer: their marks, parent and what they add to their entry, until
// the marks are read (settle()).
struct Record {
  std::string key;
  Kind kind;
  double flops, bytes;
  std::int64_t start_mark, stop_mark = -1;
  std::int64_t parent;  // index of the enclosing scope's record, or -1
};
std::shared_ptr<DeviceTimer> g_timer;  // set and used on the recording thread
std::vector<Record> g_records;

void add(const std::string& key, Kind kind, double seconds, double flops, double bytes) {
  Entry& e = g_entries[key];
  if (e.calls == 0) {
    e.name = key;
    e.kind = kind;
  }
  ++e.calls;
  e.seconds += seconds;
  e.flops += flops;
  e.bytes += bytes;
}

// Reads the marks of the finished records into the entries (exclusive times); g_mu held.
void settle() {
  if (!g_timer || g_records.empty()) return;
  std::vector<double> total(g_records.size(), 0.0), children(g_records.size(), 0.0);
  for (std::size_t i = 0; i < g_records.size(); ++i) {
    const Record& r = g_records[i];
    if (r.stop_mark < 0) continue;  // still open: only when settled from inside a scope
    total[i] = g_timer->seconds_between(r.start_mark, r.stop_mark);
    if (r.parent >= 0) children[static_cast<std::size_t>(r.parent)] += total[i];
  }
  for (std::size_t i = 0; i < g_records.size(); ++i) {
    const Record& r = g_records[i];
    if (r.stop_mark >= 0) add(r.key, r.kind, total[i] - children[i], r.flops, r.bytes);
  }
  g_records.clear();
  g_timer->clear();
}
}  // namespace

void set_device_timer(std::shared_ptr<DeviceTimer> timer) {
  std::lock_guard<std::mutex> lock(g_mu);
  settle();
  g_records.clear();
  g_timer = std::move(timer);
}

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
    g_records.clear();
    if (g_timer) g_timer->clear();
    g_owner = std::this_thread::get_id();
  }
  detail::g_enabled.store(on, std::memory_order_relaxed);
}

void resume() { detail::g_enabled.store(true, std::memory_order_relaxed); }

void reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_entries.clear();
  g_records.clear();
  if (g_timer) g_timer->clear();
}

std::vector<Entry> entries() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (t_current == nullptr) settle();
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

namespace {
std::string key_of(const char* name, std::int64_t m, std::int64_t n, std::int64_t k) {
  char key[160];
  if (m >= 0) {
    std::snprintf(key, sizeof key, "%s %lldx%lldx%lld", name, static_cast<long long>(m),
                  static_cast<long long>(n), static_cast<long long>(k));
  } else {
    std::snprintf(key, sizeof key, "%s", name);
  }
  return key;
}
}  // namespace

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
  if (g_timer) {
    // The device's clock: a mark now, one at the stop; the record is timed when read.
    const std::int64_t parent = t_current != nullptr ? t_current->record_ : -1;
    record_ = static_cast<std::int64_t>(g_records.size());
    g_records.push_back({key_of(name, m, n, k), kind, flops, bytes, g_timer->mark(), -1, parent});
  }
  parent_ = t_current;
  t_current = this;
  t0_ = std::chrono::steady_clock::now();
}

void Scope::stop() {
  t_current = parent_;
  if (record_ >= 0) {
    // (A timer removed or replaced inside the scope dropped its record.)
    if (g_timer && record_ < static_cast<std::int64_t>(g_records.size())) {
      g_records[static_cast<std::size_t>(record_)].stop_mark = g_timer->mark();
    }
    return;
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  if (parent_ != nullptr) parent_->child_s_ += elapsed;
  const std::string key = key_of(name_, m_, n_, k_);
  std::lock_guard<std::mutex> lock(g_mu);
  add(key, kind_, elapsed - child_s_, flops_, bytes_);
}

}  // namespace trident::core::profile

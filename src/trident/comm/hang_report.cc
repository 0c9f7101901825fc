// The progress board, the TCP status server and the timed-out rank's probe of every peer.
#include "trident/comm/hang_report.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "trident/core/log.h"

namespace trident::comm {

namespace {

using detail::GroupProgress;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What this process publishes about itself.
struct Board {
  std::mutex mu;
  std::vector<std::weak_ptr<GroupProgress>> groups;
  std::int64_t step = -1;
  std::weak_ptr<GroupProgress> last_group;
  OpDesc last_op{};
  int last_rank = -1;
  bool have_last = false;
  std::shared_ptr<const GroupInfo> wait_group;
  OpDesc wait_op{};
  int wait_rank = -1;
  double wait_since = 0;  // unix time; 0: not waiting
  double timed_out_at = 0;
  double reported_at = 0;  // this rank printed the job's hang report
};

Board& board() {
  static Board* b = new Board();  // leaked: the server thread may outlive static destruction
  return *b;
}

std::string describe_progress(const GroupProgress& g, int rank, const OpDesc& op) {
  return describe(GroupInfo{.name = g.name, .global_ranks = g.global_ranks}, rank, op);
}

// One peer's address card, exchanged at start-up (fixed size, all_gather of bytes).
struct Card {
  std::int32_t rank = -1;
  std::int32_t port = 0;
  std::int32_t pid = 0;
  std::uint32_t addr = 0;  // first non-loopback IPv4 address (network order), or 127.0.0.1
  char host[64] = {};
};

struct Reporter {
  int world_rank = -1;
  int world_size = 0;
  std::string host;
  std::vector<Card> cards;
  int listen_fd = -1;
};

Reporter* g_reporter = nullptr;  // set once by start_hang_reporter

// The status text this process answers with: key=value lines, one "g" line per live group.
std::string snapshot() {
  Board& b = board();
  std::lock_guard<std::mutex> lock(b.mu);
  std::ostringstream s;
  const Reporter& r = *g_reporter;
  s << "rank=" << r.world_rank << "\nhost=" << r.host << "\npid=" << ::getpid()
    << "\nstep=" << b.step << "\n";
  s.precision(17);
  s << "timed_out_at=" << b.timed_out_at << "\nreported_at=" << b.reported_at << "\n";
  if (b.wait_since > 0 && b.wait_group) {
    s << "waiting=" << describe(*b.wait_group, b.wait_rank, b.wait_op) << "\n";
    s.precision(3);
    s << "waiting_s=" << unix_now() - b.wait_since << "\n";
  }
  if (b.have_last) {
    if (auto g = b.last_group.lock())
      s << "last=" << describe_progress(*g, b.last_rank, b.last_op) << "\n";
  }
  for (const auto& w : b.groups) {
    auto g = w.lock();
    if (!g) continue;
    s << "g " << g->name << " " << g->posted << " ";
    for (std::size_t i = 0; i < g->global_ranks.size(); ++i)
      s << (i ? "," : "") << g->global_ranks[i];
    s << "\n";
  }
  return s.str();
}

void write_all(int fd, const std::string& text) {
  std::size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::send(fd, text.data() + off, text.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return;
    }
    off += static_cast<std::size_t>(n);
  }
}

// The status server: answers every "status?" request with snapshot(), forever (detached).
void serve(int listen_fd) {
  for (;;) {
    const int fd = ::accept(listen_fd, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    // The request is one line; answer whatever it is once it arrived (at most 1 s).
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    char buf[64];
    if (::poll(&p, 1, 1000) > 0 && ::recv(fd, buf, sizeof(buf), 0) > 0) write_all(fd, snapshot());
    ::close(fd);
  }
}

std::uint32_t this_host_address() {
  if (const char* a = std::getenv("TRIDENT_HANG_REPORT_ADDR")) {
    in_addr in{};
    TRIDENT_CHECK(::inet_pton(AF_INET, a, &in) == 1, "TRIDENT_HANG_REPORT_ADDR='", a,
                  "' is not an IPv4 address");
    return in.s_addr;
  }
  std::uint32_t found = htonl(INADDR_LOOPBACK);
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return found;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
    found = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    break;
  }
  ::freeifaddrs(list);
  return found;
}

// A peer's parsed answer.
struct Status {
  bool answered = false;
  std::string error;  // why there is no answer
  std::string host;
  long pid = 0;
  std::int64_t step = -1;
  double timed_out_at = 0;
  double reported_at = 0;
  std::string waiting;
  double waiting_s = 0;
  std::string last;
  // (name, members) -> posted
  std::map<std::pair<std::string, std::vector<int>>, std::int64_t> posted;
};

Status parse(const std::string& text, int expect_rank) {
  Status s;
  std::istringstream in(text);
  std::string line;
  int rank = -1;
  while (std::getline(in, line)) {
    if (line.rfind("g ", 0) == 0) {
      std::istringstream g(line.substr(2));
      std::string name, ranks;
      std::int64_t posted = 0;
      g >> name >> posted >> ranks;
      std::vector<int> members;
      std::istringstream rs(ranks);
      std::string item;
      while (std::getline(rs, item, ',')) members.push_back(std::atoi(item.c_str()));
      s.posted[{name, members}] = posted;
      continue;
    }
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "rank") rank = std::atoi(v.c_str());
    if (k == "host") s.host = v;
    if (k == "pid") s.pid = std::atol(v.c_str());
    if (k == "step") s.step = std::atoll(v.c_str());
    if (k == "timed_out_at") s.timed_out_at = std::atof(v.c_str());
    if (k == "reported_at") s.reported_at = std::atof(v.c_str());
    if (k == "waiting") s.waiting = v;
    if (k == "waiting_s") s.waiting_s = std::atof(v.c_str());
    if (k == "last") s.last = v;
  }
  if (rank != expect_rank) {
    s.error = core::str("the side channel answered for rank ", rank, " instead");
    return s;
  }
  s.answered = true;
  return s;
}

// Asks every other rank (or only those in `only`) for its status, all at once, within
// `timeout_s`. Entries of ranks not asked stay unanswered.
std::vector<Status> probe_all(double timeout_s, const std::vector<int>* only = nullptr) {
  const Reporter& r = *g_reporter;
  const int n = r.world_size;
  std::vector<Status> out(static_cast<std::size_t>(n));
  struct Conn {
    int fd = -1;
    bool sent = false;
    std::string buf;
  };
  std::vector<Conn> conns(static_cast<std::size_t>(n));
  const std::string req = "status?\n";
  for (int p = 0; p < n; ++p) {
    const auto up = static_cast<std::size_t>(p);
    if (only && std::find(only->begin(), only->end(), p) == only->end()) continue;
    if (p == r.world_rank) {
      out[up] = parse(snapshot(), p);
      continue;
    }
    const Card& c = r.cards[up];
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(c.port));
    a.sin_addr.s_addr = std::string(c.host) == r.host ? htonl(INADDR_LOOPBACK) : c.addr;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      out[up].error = core::str("socket: ", std::strerror(errno));
      continue;
    }
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
      out[up].error = core::str("connect: ", std::strerror(errno), " (the process is gone)");
      ::close(fd);
      continue;
    }
    conns[up].fd = fd;
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int p = 0; p < n; ++p) {
      Conn& c = conns[static_cast<std::size_t>(p)];
      if (c.fd < 0) continue;
      fds.push_back(
          {.fd = c.fd, .events = static_cast<short>(c.sent ? POLLIN : POLLOUT), .revents = 0});
      who.push_back(p);
    }
    if (fds.empty()) break;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      const auto up = static_cast<std::size_t>(who[i]);
      Conn& c = conns[up];
      auto finish = [&](const std::string& err) {
        if (err.empty()) {
          out[up] = parse(c.buf, who[i]);
        } else {
          out[up].error = err;
        }
        ::close(c.fd);
        c.fd = -1;
      };
      if (!c.sent) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          finish(core::str("connect: ", std::strerror(err), " (the process is gone)"));
          continue;
        }
        write_all(c.fd, req);
        c.sent = true;
        continue;
      }
      char buf[4096];
      const ssize_t got = ::recv(c.fd, buf, sizeof(buf), 0);
      if (got > 0) {
        c.buf.append(buf, static_cast<std::size_t>(got));
      } else if (got == 0) {
        finish(c.buf.empty() ? "closed without an answer" : "");
      } else if (errno != EAGAIN && errno != EINTR) {
        finish(core::str("recv: ", std::strerror(errno)));
      }
    }
  }
  for (int p = 0; p < n; ++p) {
    Conn& c = conns[static_cast<std::size_t>(p)];
    if (c.fd < 0) continue;
    ::close(c.fd);
    c.fd = -1;
    out[static_cast<std::size_t>(p)].error = core::str("no answer on the side channel within ",
                                                       timeout_s, " s (stopped, dead or cut off)");
  }
  return out;
}

std::string rank_list(const std::vector<int>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += core::str(i ? ", " : "", v[i]);
  return s + "]";
}

std::string where(int rank, const Status& s, const Card& card) {
  std::string host = s.answered ? s.host : std::string(card.host);
  return core::str("rank ", rank, " (host ", host, ", pid ", s.answered ? s.pid : card.pid, ")");
}

std::string state_of(const Status& s) {
  if (!s.answered) return s.error;
  std::string t = core::str("at iteration ", s.step, ", ");
  if (!s.waiting.empty()) {
    t += core::str("waiting ", s.waiting_s, " s in ", s.waiting);
  } else {
    t += "not waiting in any operation (computing)";
    if (!s.last.empty()) t += core::str("; last operation: ", s.last);
  }
  if (s.timed_out_at > 0) t += " [timed out]";
  return t;
}

}  // namespace

namespace detail {

std::shared_ptr<GroupProgress> track_group(const GroupInfo& group) {
  auto g = std::make_shared<GroupProgress>();
  g->name = group.name;
  g->global_ranks = group.global_ranks;
  Board& b = board();
  std::lock_guard<std::mutex> lock(b.mu);
  std::erase_if(b.groups, [](const std::weak_ptr<GroupProgress>& w) { return w.expired(); });
  b.groups.push_back(g);
  return g;
}

void note_posted(const std::shared_ptr<GroupProgress>& g, int rank, OpDesc& op) {
  Board& b = board();
  std::lock_guard<std::mutex> lock(b.mu);
  if (op.kind != OpKind::kSend && op.kind != OpKind::kRecv) op.seq = ++g->posted;
  // A timed-out rank stays flagged until its next operation (a library user may catch the error
  // and go on): peers probing meanwhile see it timed out, not computing.
  b.timed_out_at = 0;
  b.last_group = g;
  b.last_op = op;
  b.last_rank = rank;
  b.have_last = true;
}

void note_waiting(const std::shared_ptr<const GroupInfo>& group, int rank, const OpDesc& op) {
  Board& b = board();
  std::lock_guard<std::mutex> lock(b.mu);
  b.wait_group = group;
  b.wait_rank = rank;
  b.wait_op = op;
  b.wait_since = unix_now();
}

void note_done_waiting() {
  Board& b = board();
  std::lock_guard<std::mutex> lock(b.mu);
  b.wait_since = 0;
  b.wait_group.reset();
}

void note_step(std::int64_t step) {
  Board& b = board();
  std::lock_guard<std::mutex> lock(b.mu);
  b.step = std::max(b.step, step);
}

std::string on_timeout(const GroupInfo& group, int /*rank*/, const OpDesc& op) {
  if (!g_reporter) return "";
  const Reporter& r = *g_reporter;
  {
    Board& b = board();
    std::lock_guard<std::mutex> lock(b.mu);
    b.timed_out_at = unix_now();
  }
  // Ranks that time out at about the same moment see each other's flag.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double probe_s = hang_probe_timeout_s();
  const std::vector<Status> all = probe_all(probe_s);
  const Status& me = all[static_cast<std::size_t>(r.world_rank)];
  // Every other process gone: the job is being torn down (this rank was probably stopped and has
  // just been resumed by the launcher's kill sequence); there is nobody to report about.
  int gone = 0;
  for (int p = 0; p < r.world_size; ++p) {
    if (p != r.world_rank &&
        all[static_cast<std::size_t>(p)].error.find("process is gone") != std::string::npos) {
      ++gone;
    }
  }
  if (r.world_size > 1 && gone == r.world_size - 1) {
    return "every other rank has exited";
  }

  // The operation that timed out, and which members had reached it.
  const bool p2p = op.kind == OpKind::kSend || op.kind == OpKind::kRecv;
  std::vector<int> asked;
  if (p2p) {
    if (op.peer >= 0 && op.peer < static_cast<int>(group.global_ranks.size())) {
      asked.push_back(group.global_ranks[static_cast<std::size_t>(op.peer)]);
    }
  } else {
    for (int m : group.global_ranks) {
      if (m != r.world_rank) asked.push_back(m);
    }
  }
  std::vector<int> reached{r.world_rank};
  std::vector<std::string> missing;
  for (int m : asked) {
    const Status& s = all[static_cast<std::size_t>(m)];
    const Card& card = r.cards[static_cast<std::size_t>(m)];
    bool got_there = false;
    if (s.answered && !p2p) {
      const auto it = s.posted.find({group.name, group.global_ranks});
      got_there = it != s.posted.end() && it->second >= op.seq;
    }
    if (got_there) {
      reached.push_back(m);
    } else {
      missing.push_back(core::str(where(m, s, card), ": ", state_of(s)));
    }
  }
  // The culprits: ranks that do not answer, and ranks that answer but wait in no operation while
  // others wait for them (stuck computing, or in a loop outside communication).
  std::vector<std::string> culprits;
  for (int p = 0; p < r.world_size; ++p) {
    const Status& s = all[static_cast<std::size_t>(p)];
    if (!s.answered || (s.waiting.empty() && s.timed_out_at <= 0)) {
      culprits.push_back(
          core::str(where(p, s, r.cards[static_cast<std::size_t>(p)]), ": ", state_of(s)));
    }
  }

  std::string opname = op_name(op.kind);
  if (!p2p) opname += core::str(" #", op.seq);
  std::string summary = "culprit: ";
  if (culprits.empty()) {
    summary +=
        "none found (every rank waits in an operation: collectives called in different "
        "orders on different ranks?)";
  }
  for (std::size_t i = 0; i < culprits.size(); ++i) summary += (i ? "; " : "") + culprits[i];
  summary += core::str(" | ", opname, " on group '", group.name, "' (global ranks ",
                       rank_list(group.global_ranks), ") timed out on rank ", r.world_rank,
                       " (host ", r.host, ") at iteration ", me.step);
  if (p2p) {
    summary += core::str("; its peer ", missing.empty() ? std::string("answered") : missing[0]);
  } else {
    summary += core::str("; reached by ", rank_list(reached));
    if (missing.empty()) {
      summary += "; every member reached it (the collective itself is stuck)";
    } else {
      summary += "; NOT reached by ";
      for (std::size_t i = 0; i < missing.size(); ++i) summary += (i ? "; " : "") + missing[i];
    }
  }

  // The rank whose timeout came first reports; the others leave the job to it.
  int reporter = r.world_rank;
  double first = me.timed_out_at;
  for (int p = 0; p < r.world_size; ++p) {
    const Status& s = all[static_cast<std::size_t>(p)];
    if (!s.answered || s.timed_out_at <= 0) continue;
    if (s.timed_out_at < first || (s.timed_out_at == first && p < reporter)) {
      first = s.timed_out_at;
      reporter = p;
    }
  }
  if (reporter != r.world_rank) {
    // Leave the job to the reporter's MPI_Abort: wait until it has printed (or a few seconds).
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(probe_s + 3);
    const std::vector<int> only{reporter};
    while (std::chrono::steady_clock::now() < until) {
      const Status s = probe_all(0.5, &only)[static_cast<std::size_t>(reporter)];
      if (!s.answered || s.reported_at >= first) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return core::str(summary, " (rank ", reporter, " reports for the job)");
  }
  std::fflush(stdout);
  for (int p = 0; p < r.world_size; ++p) {
    const Status& s = all[static_cast<std::size_t>(p)];
    std::fprintf(stderr, "trident: hang report: %s: %s\n",
                 where(p, s, r.cards[static_cast<std::size_t>(p)]).c_str(), state_of(s).c_str());
  }
  std::fprintf(stderr, "trident: hang summary: %s\n", summary.c_str());
  std::fflush(stderr);
  {
    Board& b = board();
    std::lock_guard<std::mutex> lock(b.mu);
    b.reported_at = unix_now();
  }
  return summary;
}

}  // namespace detail

void start_hang_reporter(Communicator& world) {
  if (g_reporter) return;
  if (const char* off = std::getenv("TRIDENT_HANG_REPORT"); off && std::strcmp(off, "0") == 0) {
    return;
  }
  auto* r = new Reporter();  // leaked with its detached server thread
  r->world_rank = world.rank();
  r->world_size = world.size();
  r->host = log::short_hostname();
  Card mine;
  mine.rank = r->world_rank;
  mine.pid = static_cast<std::int32_t>(::getpid());
  mine.addr = this_host_address();
  std::snprintf(mine.host, sizeof(mine.host), "%s", r->host.c_str());
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = fd >= 0;
  if (ok) {
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = 0;
    socklen_t len = sizeof(a);
    ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd, 128) == 0 &&
         ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
    mine.port = ok ? ntohs(a.sin_port) : 0;
  }
  // Collective even when this rank's socket failed (port 0: the others know it cannot answer).
  r->cards.resize(static_cast<std::size_t>(r->world_size));
  world.all_gather(&mine, r->cards.data(), sizeof(Card), Datatype::kU8);
  if (!ok) {
    log::warn("comm: hang reports are off on this rank: cannot listen on a TCP port (",
              std::strerror(errno), ")");
    if (fd >= 0) ::close(fd);
    delete r;
    return;
  }
  r->listen_fd = fd;
  g_reporter = r;
  std::thread(serve, fd).detach();
}

bool hang_reporter_running() { return g_reporter != nullptr; }

double hang_probe_timeout_s() {
  if (const char* v = std::getenv("TRIDENT_HANG_PROBE_S")) {
    const double s = std::atof(v);
    if (s > 0) return s;
  }
  return 2.0;
}

}  // namespace trident::comm

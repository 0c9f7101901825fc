#include "trident/parallel/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "trident/core/error.h"

namespace trident::parallel {

PipelineScheduleKind parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineScheduleKind::kGPipe;
  if (name == "1f1b") return PipelineScheduleKind::k1F1B;
  if (name == "interleaved") return PipelineScheduleKind::kInterleaved1F1B;
  throw core::InvalidArgument(core::str("--pipeline-schedule: unknown schedule '", name,
                                        "' (use gpipe, 1f1b or interleaved)"));
}

const char* pipeline_schedule_name(PipelineScheduleKind kind) {
  switch (kind) {
    case PipelineScheduleKind::kGPipe:
      return "gpipe";
    case PipelineScheduleKind::k1F1B:
      return "1f1b";
    case PipelineScheduleKind::kInterleaved1F1B:
      return "interleaved";
  }
  return "?";
}

namespace {

void check_shape(PipelineScheduleKind kind, const PipelineShape& s, int stage) {
  TRIDENT_CHECK(s.num_stages >= 1 && s.num_microbatches >= 1 && s.num_chunks >= 1,
                "pipeline needs stages, micro-batches and chunks >= 1, got ", s.num_stages, ", ",
                s.num_microbatches, ", ", s.num_chunks);
  TRIDENT_CHECK(stage >= 0 && stage < s.num_stages, "stage ", stage, " out of ", s.num_stages);
  if (kind != PipelineScheduleKind::kInterleaved1F1B) {
    TRIDENT_CHECK(s.num_chunks == 1,
                  "only the interleaved schedule runs several model chunks "
                  "per stage (--num-layers-per-virtual-pipeline-stage needs "
                  "--pipeline-schedule interleaved)");
  } else {
    TRIDENT_CHECK(s.num_microbatches % s.num_stages == 0,
                  "the interleaved schedule needs the "
                  "number of micro-batches (",
                  s.num_microbatches,
                  ") to be a multiple of "
                  "--pipeline-model-parallel-size (",
                  s.num_stages, ")");
  }
}

// Megatron's interleaved order: the k-th forward (or backward) of a stage works on
// micro-batch (k / (P v)) P + k mod P of chunk (k mod (P v)) / P (backward: chunks reversed).
PipeStep interleaved_step(PipeOp op, int k, const PipelineShape& s) {
  const int P = s.num_stages, v = s.num_chunks;
  const int group = k / (P * v), in_group = k % (P * v);
  int chunk = in_group / P;
  if (op == PipeOp::kBackward) chunk = v - 1 - chunk;
  return {op, group * P + in_group % P, chunk};
}

}  // namespace

std::vector<PipeStep> build_pipeline_schedule(PipelineScheduleKind kind, const PipelineShape& s,
                                              int stage) {
  check_shape(kind, s, stage);
  const int P = s.num_stages, m = s.num_microbatches;
  std::vector<PipeStep> steps;
  switch (kind) {
    case PipelineScheduleKind::kGPipe:
      for (int i = 0; i < m; ++i) steps.push_back({PipeOp::kForward, i, 0});
      for (int i = 0; i < m; ++i) steps.push_back({PipeOp::kBackward, i, 0});
      break;
    case PipelineScheduleKind::k1F1B: {
      const int warmup = std::min(P - stage - 1, m);
      for (int i = 0; i < warmup; ++i) steps.push_back({PipeOp::kForward, i, 0});
      for (int i = 0; i < m - warmup; ++i) {
        steps.push_back({PipeOp::kForward, i + warmup, 0});
        steps.push_back({PipeOp::kBackward, i, 0});
      }
      for (int i = m - warmup; i < m; ++i) steps.push_back({PipeOp::kBackward, i, 0});
      break;
    }
    case PipelineScheduleKind::kInterleaved1F1B: {
      const int v = s.num_chunks, total = m * v;
      const int warmup = std::min((P - stage - 1) * 2 + (v - 1) * P, total);
      int f = 0, b = 0;
      for (; f < warmup; ++f) steps.push_back(interleaved_step(PipeOp::kForward, f, s));
      while (f < total) {
        steps.push_back(interleaved_step(PipeOp::kForward, f++, s));
        steps.push_back(interleaved_step(PipeOp::kBackward, b++, s));
      }
      while (b < total) steps.push_back(interleaved_step(PipeOp::kBackward, b++, s));
      break;
    }
  }
  return steps;
}

int max_in_flight(const std::vector<PipeStep>& steps) {
  int live = 0, peak = 0;
  for (const PipeStep& st : steps) {
    live += st.op == PipeOp::kForward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

std::vector<int> max_in_flight_per_chunk(const std::vector<PipeStep>& steps, int num_chunks) {
  std::vector<int> live(static_cast<std::size_t>(num_chunks), 0), peak(live.size(), 1);
  for (const PipeStep& st : steps) {
    int& l = live[static_cast<std::size_t>(st.chunk)];
    l += st.op == PipeOp::kForward ? 1 : -1;
    peak[static_cast<std::size_t>(st.chunk)] =
        std::max(peak[static_cast<std::size_t>(st.chunk)], l);
  }
  return peak;
}

std::string simulate_pipeline(PipelineScheduleKind kind, const PipelineShape& s) {
  const int P = s.num_stages, v = s.num_chunks, m = s.num_microbatches;
  std::vector<std::vector<PipeStep>> sched(static_cast<std::size_t>(P));
  for (int st = 0; st < P; ++st)
    sched[static_cast<std::size_t>(st)] = build_pipeline_schedule(kind, s, st);
  std::ostringstream err;
  // Per-stage invariants: one forward and one backward per (micro-batch, chunk), backward after.
  for (int st = 0; st < P; ++st) {
    std::map<std::pair<int, int>, int> fwd_at, bwd_at;
    const auto& steps = sched[static_cast<std::size_t>(st)];
    for (int i = 0; i < static_cast<int>(steps.size()); ++i) {
      auto& where = steps[static_cast<std::size_t>(i)].op == PipeOp::kForward ? fwd_at : bwd_at;
      const auto key = std::make_pair(steps[static_cast<std::size_t>(i)].microbatch,
                                      steps[static_cast<std::size_t>(i)].chunk);
      if (where.count(key)) {
        err << "stage " << st << " runs micro-batch " << key.first << " chunk " << key.second
            << " twice";
        return err.str();
      }
      where[key] = i;
    }
    if (static_cast<int>(fwd_at.size()) != m * v || static_cast<int>(bwd_at.size()) != m * v) {
      err << "stage " << st << " has " << fwd_at.size() << " forwards and " << bwd_at.size()
          << " backwards, expected " << m * v;
      return err.str();
    }
    for (auto& [key, at] : bwd_at) {
      if (!fwd_at.count(key) || fwd_at[key] > at) {
        err << "stage " << st << ": backward of micro-batch " << key.first << " before its forward";
        return err.str();
      }
    }
  }
  // Dependencies: the forward of virtual stage u = c P + st needs the forward output of u - 1;
  // its backward needs the backward of u + 1 (and, on the last virtual stage, its own forward).
  const int V = P * v;
  std::set<std::tuple<int, int, int>> done;  // (op, micro, virtual stage)
  std::vector<std::size_t> pc(static_cast<std::size_t>(P), 0);
  std::size_t remaining = 0;
  for (auto& steps : sched) remaining += steps.size();
  while (remaining > 0) {
    bool progress = false;
    for (int st = 0; st < P; ++st) {
      auto& i = pc[static_cast<std::size_t>(st)];
      const auto& steps = sched[static_cast<std::size_t>(st)];
      while (i < steps.size()) {
        const PipeStep& step = steps[i];
        const int u = step.chunk * P + st;
        bool ready;
        if (step.op == PipeOp::kForward) {
          ready = u == 0 || done.count({0, step.microbatch, u - 1});
        } else {
          ready = done.count({0, step.microbatch, u}) &&
                  (u == V - 1 || done.count({1, step.microbatch, u + 1}));
        }
        if (!ready) break;  // a blocking receive: this stage waits here
        done.insert({step.op == PipeOp::kForward ? 0 : 1, step.microbatch, u});
        ++i;
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      err << "deadlock: ";
      for (int st = 0; st < P; ++st) {
        const auto& steps = sched[static_cast<std::size_t>(st)];
        const auto i = pc[static_cast<std::size_t>(st)];
        if (i < steps.size()) {
          err << "stage " << st << " waits at " << (steps[i].op == PipeOp::kForward ? "F" : "B")
              << steps[i].microbatch << "c" << steps[i].chunk << "; ";
        }
      }
      return err.str();
    }
  }
  return "";
}

LockstepPlan build_lockstep_plan(PipelineScheduleKind kind, const PipelineShape& s, int stage) {
  const int P = s.num_stages, v = s.num_chunks, m = s.num_microbatches, V = P * v;
  const auto z = [](auto i) { return static_cast<std::size_t>(i); };
  std::vector<std::vector<PipeStep>> sched(z(P));
  for (int st = 0; st < P; ++st) sched[z(st)] = build_pipeline_schedule(kind, s, st);
  // arrived[kind][u * m + micro]: the input of virtual stage u's forward (kind 0) or backward
  // (kind 1) of the micro-batch has been received.
  std::vector<char> arrived[2] = {std::vector<char>(z(V * m), 0), std::vector<char>(z(V * m), 0)};
  std::vector<std::size_t> pc(z(P), 0);
  std::size_t remaining = 0;
  for (const auto& steps : sched) remaining += steps.size();
  LockstepPlan plan;
  plan.slots_per_chunk.assign(z(v), 1);
  std::vector<int> live(z(v), 0);
  const auto hold = [&](int chunk, int delta) {
    int& n = live[z(chunk)];
    n += delta;
    plan.slots_per_chunk[z(chunk)] = std::max(plan.slots_per_chunk[z(chunk)], n);
  };
  for (int round = 0; remaining > 0; ++round) {
    PipeRound mine;
    mine.round = round;
    bool progress = false;
    int freed = -1;  // the chunk whose backward this stage ran: its slot frees after the exchange
    std::vector<PipeMessage> produced;  // peer = the receiving stage here
    for (int st = 0; st < P; ++st) {
      std::size_t& i = pc[z(st)];
      if (i == sched[z(st)].size()) continue;
      const PipeStep& step = sched[z(st)][i];
      const int u = step.chunk * P + st;
      const bool fwd = step.op == PipeOp::kForward;
      const bool ready = fwd ? (u == 0 || arrived[0][z(u * m + step.microbatch)])
                             : (u == V - 1 || arrived[1][z(u * m + step.microbatch)]);
      if (!ready) continue;
      progress = true;
      if (st == stage) {
        mine.step = static_cast<int>(i);
        if (fwd && u == 0) hold(step.chunk, +1);
        if (!fwd) freed = step.chunk;
      }
      ++i;
      --remaining;
      if (fwd && u < V - 1) produced.push_back({false, step.microbatch, u, (u + 1) % P, 0});
      if (!fwd && u > 0) produced.push_back({true, step.microbatch, u, (u - 1) % P, 0});
    }
    TRIDENT_ASSERT(progress, "the pipeline schedule cannot make progress in lockstep (", remaining,
                   " steps left)");
    for (const PipeMessage& msg : produced) {
      const int to = msg.gradient ? msg.from_virtual - 1 : msg.from_virtual + 1;
      arrived[msg.gradient ? 1 : 0][z(to * m + msg.microbatch)] = 1;
      const int from_stage = msg.from_virtual % P, to_stage = to % P;
      if (from_stage == stage) {
        mine.sends.push_back(
            {msg.gradient, msg.microbatch, msg.from_virtual, to_stage, msg.from_virtual / P});
      }
      if (to_stage == stage) {
        mine.recvs.push_back({msg.gradient, msg.microbatch, msg.from_virtual, from_stage, to / P});
        if (!msg.gradient) hold(to / P, +1);
      }
    }
    if (freed >= 0) hold(freed, -1);
    const auto order = [](const PipeMessage& a, const PipeMessage& b) {
      return std::tie(a.peer, a.gradient, a.microbatch, a.from_virtual) <
             std::tie(b.peer, b.gradient, b.microbatch, b.from_virtual);
    };
    std::sort(mine.sends.begin(), mine.sends.end(), order);
    std::sort(mine.recvs.begin(), mine.recvs.end(), order);
    if (mine.step >= 0 || !mine.sends.empty() || !mine.recvs.empty()) {
      plan.rounds.push_back(std::move(mine));
    }
  }
  return plan;
}

StagePlan plan_stage(PipelineScheduleKind kind, const PipelineShape& s, int stage) {
  StagePlan p;
  p.schedule = build_pipeline_schedule(kind, s, stage);
  p.slots_per_chunk = max_in_flight_per_chunk(p.schedule, s.num_chunks);
  if (s.num_chunks > 1 && s.num_stages > 1) {
    p.lockstep = build_lockstep_plan(kind, s, stage);
    for (std::size_t c = 0; c < p.slots_per_chunk.size(); ++c)
      p.slots_per_chunk[c] = std::max(p.slots_per_chunk[c], p.lockstep->slots_per_chunk[c]);
  }
  return p;
}

std::vector<int> activation_slots_per_chunk(PipelineScheduleKind kind, const PipelineShape& s,
                                            int stage) {
  return plan_stage(kind, s, stage).slots_per_chunk;
}

}  // namespace trident::parallel

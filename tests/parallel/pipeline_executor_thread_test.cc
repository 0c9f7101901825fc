// parallel::PipelineExecutor on thread worlds with a fake stage whose "model" is a chain of
// additions: virtual stage s adds s + 1 to its input on the way forward and s + 1 to the
// gradient on the way back, so every received tensor says which micro-batch it is and which
// stages it went through. Checked for every schedule: each (chunk, micro-batch) runs one forward
// then one backward, each step sees exactly the tensor its neighbour produced for it, a slot is
// never shared by two live micro-batches, and the chunk's last backward is flagged once.
#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "trident/comm/thread_communicator.h"
#include "trident/parallel/pipeline_executor.h"

namespace trident::parallel {
namespace {

constexpr std::int64_t kElements = 5;

// Per chunk, per slot: the input, output and gradient buffers.
class ChainStage final : public PipelineStage {
 public:
  explicit ChainStage(int chunks) : slots_(static_cast<std::size_t>(chunks)) {}
  int num_chunks() const override { return static_cast<int>(slots_.size()); }
  void add_slots(int chunk, int count) override {
    auto& s = slots_[static_cast<std::size_t>(chunk)];
    EXPECT_GT(count, static_cast<int>(s.size())) << "slots never shrink or stay";
    s.resize(static_cast<std::size_t>(count));
  }
  Boundary boundary(int chunk, int slot) override {
    Buffers& b = at(chunk, slot);
    return {.input = b.input.data(),
            .output = b.output.data(),
            .gradient = b.gradient.data(),
            .elements = kElements};
  }
  struct Buffers {
    std::vector<float> input = std::vector<float>(kElements),
                       output = std::vector<float>(kElements),
                       gradient = std::vector<float>(kElements);
  };
  Buffers& at(int chunk, int slot) {
    return slots_[static_cast<std::size_t>(chunk)][static_cast<std::size_t>(slot)];
  }
  int slot_count(int chunk) const {
    return static_cast<int>(slots_[static_cast<std::size_t>(chunk)].size());
  }

 private:
  std::vector<std::vector<Buffers>> slots_;
};

struct Case {
  PipelineScheduleKind kind;
  int stages, chunks, micro;
  std::string name;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// What one rank saw; errors are collected as text and checked on the main thread.
struct RankLog {
  std::vector<std::string> errors;
  int last_flags = 0;
  int forwards = 0, backwards = 0;
};

void run_pass(const Case& c, bool train, std::vector<RankLog>& logs) {
  const int V = c.stages * c.chunks;
  comm::run_on_threads(
      c.stages,
      [&](comm::Communicator& pp) {
        RankLog& log = logs[static_cast<std::size_t>(pp.rank())];
        const auto fail = [&](const std::string& what) { log.errors.push_back(what); };
        ChainStage stage(c.chunks);
        PipelineExecutor ex(stage, pp, c.kind, c.micro);
        for (int ch = 0; ch < c.chunks; ++ch) {
          if (stage.slot_count(ch) != ex.slots_of(ch)) fail("slot counts differ");
        }
        const auto virt = [&](int chunk) { return chunk * c.stages + pp.rank(); };
        // (chunk, micro) -> slot while it is live.
        std::map<std::pair<int, int>, int> live;
        std::set<std::pair<int, int>> done;
        StageWork work;
        work.forward = [&](int chunk, int slot, int micro) {
          ++log.forwards;
          const int v = virt(chunk);
          for (const auto& [key, s] : live) {
            if (key.first == chunk && s == slot) fail("slot shared by two live micro-batches");
          }
          if (train) live[{chunk, micro}] = slot;
          ChainStage::Buffers& b = stage.at(chunk, slot);
          // Virtual stage 0 starts from the micro-batch's id; the others receive the chain so far.
          const float want = 1000.0f * micro + static_cast<float>(v * (v + 1) / 2);
          if (v == 0) std::fill(b.input.begin(), b.input.end(), 1000.0f * micro);
          for (float x : b.input) {
            if (x != want) {
              fail("forward v" + std::to_string(v) + " micro " + std::to_string(micro) +
                   ": input " + std::to_string(x) + " != " + std::to_string(want));
              break;
            }
          }
          for (std::size_t i = 0; i < b.output.size(); ++i) b.output[i] = b.input[i] + v + 1;
        };
        work.backward = [&](int chunk, int slot, int micro, bool last) {
          ++log.backwards;
          const int v = virt(chunk);
          const auto it = live.find({chunk, micro});
          if (it == live.end()) {
            fail("backward before forward");
            return;
          }
          if (it->second != slot) fail("backward in another slot than its forward");
          live.erase(it);
          if (!done.insert({chunk, micro}).second) fail("two backwards of one micro-batch");
          if (last) {
            ++log.last_flags;
            for (int m = 0; m < c.micro; ++m) {
              if (!done.count({chunk, m})) fail("last backward flagged before the chunk's end");
            }
          }
          ChainStage::Buffers& b = stage.at(chunk, slot);
          // The last virtual stage starts the gradient; the others receive it from above.
          float want = -1000.0f * micro;
          for (int u = V - 1; u > v; --u) want += static_cast<float>(u + 1);
          if (v == V - 1) std::fill(b.gradient.begin(), b.gradient.end(), -1000.0f * micro);
          for (float g : b.gradient) {
            if (g != want) {
              fail("backward v" + std::to_string(v) + " micro " + std::to_string(micro) +
                   ": gradient " + std::to_string(g) + " != " + std::to_string(want));
              break;
            }
          }
          for (float& g : b.gradient) g += static_cast<float>(v + 1);  // sent on, in place
        };
        for (int pass = 0; pass < 2; ++pass) {  // slots are reused across passes
          live.clear();
          done.clear();
          if (train) {
            const PassStats st = ex.train(work);
            if (st.max_live_activations < 1) fail("no live activations counted");
          } else {
            (void)ex.forward_only(c.micro, work);
          }
          if (!live.empty()) fail("activations left alive after the pass");
        }
      },
      comm::WaitPolicy{.timeout_s = 30.0});
}

class ExecutorSchedules : public ::testing::TestWithParam<Case> {};

TEST_P(ExecutorSchedules, EveryStepSeesItsNeighboursTensor) {
  const Case& c = GetParam();
  std::vector<RankLog> logs(static_cast<std::size_t>(c.stages));
  run_pass(c, /*train=*/true, logs);
  for (int r = 0; r < c.stages; ++r) {
    const RankLog& log = logs[static_cast<std::size_t>(r)];
    SCOPED_TRACE("stage " + std::to_string(r));
    EXPECT_TRUE(log.errors.empty()) << log.errors.front();
    EXPECT_EQ(log.forwards, 2 * c.chunks * c.micro);
    EXPECT_EQ(log.backwards, 2 * c.chunks * c.micro);
    EXPECT_EQ(log.last_flags, 2 * c.chunks);  // once per chunk per pass
  }
}

TEST_P(ExecutorSchedules, ForwardOnlyPassesTheChain) {
  const Case& c = GetParam();
  std::vector<RankLog> logs(static_cast<std::size_t>(c.stages));
  run_pass(c, /*train=*/false, logs);
  for (int r = 0; r < c.stages; ++r) {
    const RankLog& log = logs[static_cast<std::size_t>(r)];
    EXPECT_TRUE(log.errors.empty()) << log.errors.front();
    EXPECT_EQ(log.forwards, 2 * c.chunks * c.micro);
    EXPECT_EQ(log.backwards, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ExecutorSchedules,
    ::testing::Values(Case{PipelineScheduleKind::k1F1B, 1, 1, 3, "one_stage"},
                      Case{PipelineScheduleKind::kGPipe, 2, 1, 3, "gpipe_p2"},
                      Case{PipelineScheduleKind::k1F1B, 2, 1, 4, "onef1b_p2"},
                      Case{PipelineScheduleKind::k1F1B, 4, 1, 6, "onef1b_p4"},
                      Case{PipelineScheduleKind::kInterleaved1F1B, 2, 2, 4, "interleaved_p2v2"},
                      Case{PipelineScheduleKind::kInterleaved1F1B, 4, 2, 8, "interleaved_p4v2"},
                      Case{PipelineScheduleKind::kInterleaved1F1B, 2, 3, 6, "interleaved_p2v3"}),
    [](const auto& p) { return p.param.name; });

// A larger micro-batch count adds slots (--rampup-batch-size) and the chain still holds.
TEST(PipelineExecutor, MoreMicroBatchesAddSlots) {
  comm::run_on_threads(
      2,
      [](comm::Communicator& pp) {
        ChainStage stage(1);
        PipelineExecutor ex(stage, pp, PipelineScheduleKind::kGPipe, 2);
        EXPECT_EQ(stage.slot_count(0), 2);
        ex.set_num_microbatches(5);
        EXPECT_EQ(stage.slot_count(0), 5);
        EXPECT_EQ(ex.slots_of(0), 5);
        ex.set_num_microbatches(3);  // keeps what it has
        EXPECT_EQ(stage.slot_count(0), 5);
      },
      comm::WaitPolicy{.timeout_s = 30.0});
}

}  // namespace
}  // namespace trident::parallel

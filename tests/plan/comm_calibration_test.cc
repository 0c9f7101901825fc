// `--calibrate-comm` (plan/comm_calibration.h) and how the CPU time model uses what it measured:
// every group size that divides the job is timed, at every size, identically on every rank; a
// layout's collectives are then priced from the measured times of its job size (and only its
// job size), for TP, ZeRO and pipeline traffic; without them the copy-bandwidth model stays.
#include "trident/plan/comm_calibration.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <mutex>
#include <sstream>

#include "flat_calibration.h"
#include "trident/comm/thread_communicator.h"
#include "trident/core/error.h"
#include "trident/plan/plan.h"

namespace trident::plan {
namespace {

TEST(CalibrateComm, TimesEveryGroupSizeThatDividesTheJob) {
  std::vector<std::map<std::string, CommCosts>> got(4);
  std::mutex m;
  comm::run_on_threads(4, [&](comm::Communicator& world) {
    auto r = calibrate_comm(world, /*passes=*/1, /*target_s=*/1e-3);
    const std::lock_guard<std::mutex> lock(m);
    got[static_cast<std::size_t>(world.rank())] = std::move(r);
  });
  ASSERT_EQ(got[0].size(), 2u);  // groups of 2 and 4; 3 does not divide 4
  for (const std::string key : {"4,2", "4,4"}) {
    ASSERT_TRUE(got[0].count(key)) << key;
    const CommCosts& c = got[0].at(key);
    EXPECT_EQ(c.bytes, comm_calibration_sizes());
    for (const auto* t : {&c.all_reduce_s, &c.reduce_scatter_s, &c.all_gather_s, &c.p2p_s}) {
      ASSERT_EQ(t->size(), c.bytes.size()) << key;
      for (const double s : *t) EXPECT_TRUE(s > 0 && std::isfinite(s)) << key;
    }
  }
  // The slowest rank's time, agreed: every rank holds the same costs.
  for (int r = 1; r < 4; ++r) EXPECT_EQ(got[static_cast<std::size_t>(r)], got[0]) << r;
}

TEST(CalibrateComm, InterferenceIsMeasuredForEveryGroupAndAgreed) {
  std::vector<std::map<std::string, CommCosts>> got(2);
  std::mutex m;
  comm::run_on_threads(2, [&](comm::Communicator& world) {
    auto r = calibrate_comm(world, /*passes=*/1, /*target_s=*/1e-3);
    calibrate_interference(world, /*threads=*/1, /*cores=*/2, r, /*passes=*/1,
                           /*target_s=*/0.01);
    const std::lock_guard<std::mutex> lock(m);
    got[static_cast<std::size_t>(world.rank())] = std::move(r);
  });
  ASSERT_TRUE(got[0].count("2,2"));
  const CommCosts& c = got[0].at("2,2");
  EXPECT_NE(c.corun_gemm, 1.0) << "a measured ratio";
  EXPECT_GE(c.corun_gemm, 0.5);
  EXPECT_LE(c.corun_gemm, 16);
  EXPECT_TRUE(c.sync_wait_s >= 0 && c.sync_wait_s <= 1) << c.sync_wait_s;
  EXPECT_TRUE(c.sync_wait_fraction >= 0 && c.sync_wait_fraction <= 4) << c.sync_wait_fraction;
  EXPECT_EQ(got[1], got[0]) << "every rank holds the same figures";
}

TEST(CalibrateComm, NeedsTwoRanks) {
  comm::run_on_threads(1, [](comm::Communicator& world) {
    EXPECT_THROW(calibrate_comm(world), core::InvalidArgument);
  });
}

TEST(CommCosts, PiecewiseLinearInTheSizeAndTheLastRateBeyond) {
  const std::vector<std::int64_t> b = {1000, 2000, 4000};
  const std::vector<double> t = {1.0, 3.0, 4.0};
  EXPECT_DOUBLE_EQ(CommCosts::at(b, t, 10), 1.0);  // below the first size: its time
  EXPECT_DOUBLE_EQ(CommCosts::at(b, t, 1500), 2.0);
  EXPECT_DOUBLE_EQ(CommCosts::at(b, t, 3000), 3.5);
  EXPECT_DOUBLE_EQ(CommCosts::at(b, t, 8000), 8.0);  // above: the last point's rate
}

train::TrainConfig medium(const std::string& layout, int world) {
  train::TrainConfig cfg;
  CLI::App app;
  train::add_train_options(app, cfg);
  std::vector<std::string> args;
  std::istringstream in(
      "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 "
      "--micro-batch-size 2 --global-batch-size 16 --tokenizer-type NullTokenizer "
      "--vocab-size 300 --data-path x " +
      layout);
  for (std::string a; in >> a;) args.push_back(a);
  std::reverse(args.begin(), args.end());
  app.parse(args);
  cfg.finalize(world);
  cfg.model.vocab_size = 300;
  return cfg;
}

// A complete calibration with round numbers (kernels 1 us each), and collectives for a job of
// `world` ranks in groups of 2 that cost `seconds` per call at any size up to 1 GiB.
Calibration flat(int world, double seconds) {
  Calibration c = testing::flat_kernels(64);  // 64 cores: no oversubscription term
  if (seconds > 0) {
    CommCosts cc;
    cc.bytes = {1, std::int64_t{1} << 30};
    for (auto* v : {&cc.all_reduce_s, &cc.reduce_scatter_s, &cc.all_gather_s, &cc.p2p_s}) {
      v->assign(2, seconds);
    }
    c.comm[comm_key(world, 2)] = cc;
  }
  return c;
}

Cluster cpu(int world, const Calibration& cal) {
  Cluster c;
  c.hw.name = "cpu";
  c.hw.is_cpu = true;
  c.hw.gpus_per_node = 1 << 20;
  c.num_gpus = world;
  c.calibration = cal;
  c.hw.memory_bw = cal.memory_bw;
  c.hw.intra_bw = c.hw.inter_bw = cal.memory_bw / 2;
  c.hw.intra_latency = c.hw.inter_latency = 10e-6;
  return c;
}

// Collectives of the layout, in calls: the measured time per call is the same at every size, so
// the priced communication is a whole number of calls, and doubling the time doubles it.
double calls(double priced, double per_call) { return priced / per_call; }

TEST(PlanTime, MeasuredCollectivesPriceTheLayoutsCommunication) {
  const train::TrainConfig tp2 = medium("--tensor-model-parallel-size 2", 2);
  const TimeBreakdown a = predict_time(tp2, cpu(2, flat(2, 1e-3)));
  const TimeBreakdown b = predict_time(tp2, cpu(2, flat(2, 2e-3)));
  ASSERT_GT(a.tp_comm, 0);
  EXPECT_NEAR(b.tp_comm, 2 * a.tp_comm, 1e-12);
  const double n = calls(a.tp_comm, 1e-3);
  EXPECT_NEAR(n, std::round(n), 1e-6) << "a whole number of collectives";
  EXPECT_GE(n, 4 * 2) << "at least the forward's two all-reduces per layer";
  // Measured for another job size: not used (ranks sharing cores wait differently).
  const TimeBreakdown other = predict_time(tp2, cpu(2, flat(4, 1e-3)));
  const TimeBreakdown modelled = predict_time(tp2, cpu(2, flat(2, 0)));
  EXPECT_DOUBLE_EQ(other.tp_comm, modelled.tp_comm);
  EXPECT_NE(modelled.tp_comm, a.tp_comm);

  // ZeRO-1 over 2 ranks: its DDP buckets' reduce-scatters and one all-gather, all exposed.
  const train::TrainConfig z1 = medium("--zero-stage 1", 2);
  const TimeBreakdown z = predict_time(z1, cpu(2, flat(2, 1e-3)));
  const double zc = calls(z.dp_comm, 1e-3);
  EXPECT_NEAR(zc, std::round(zc), 1e-6);
  EXPECT_GE(zc, 2);
  EXPECT_DOUBLE_EQ(z.dp_exposed, z.dp_comm);

  // ZeRO-2: every micro-batch reduce-scatters each of the 4 layers in its own call; the
  // non-layer gradients (embeddings, final LayerNorm) once per iteration. Twice the micro-batches
  // (4 -> 8) add 4 x 4 layer calls and no other.
  const TimeBreakdown z2 = predict_time(medium("--zero-stage 2", 2), cpu(2, flat(2, 1e-3)));
  const TimeBreakdown z2x2 =
      predict_time(medium("--zero-stage 2 --global-batch-size 32", 2), cpu(2, flat(2, 1e-3)));
  const double c2 = calls(z2.dp_comm, 1e-3);
  EXPECT_NEAR(c2, std::round(c2), 1e-6);
  EXPECT_GE(c2, 4 * 4 + 2) << "the layers' calls, at least one non-layer range, the all-gather";
  EXPECT_NEAR(calls(z2x2.dp_comm, 1e-3) - c2, 4 * 4, 1e-6);

  // The pipeline's sends: one measured message per receive.
  const train::TrainConfig pp2 = medium("--pipeline-model-parallel-size 2", 2);
  const TimeBreakdown p = predict_time(pp2, cpu(2, flat(2, 1e-3)));
  const TimeBreakdown pm = predict_time(pp2, cpu(2, flat(2, 0)));
  EXPECT_GT(p.iteration, pm.iteration);
}

// With the ranks' interference measured, a job of several ranks pays it: GEMMs by the co-run ratio
// and the noise fraction, the other kernels by the noise fraction, and every synchronising call
// its fixed wait; with more ranks than cores, inside the shared-cores bound.
TEST(PlanTime, TheRanksInterferenceSlowsComputeAndEveryCollective) {
  const train::TrainConfig tp2 = medium("--tensor-model-parallel-size 2", 2);
  Calibration cal = flat(2, 1e-3);
  const TimeBreakdown base = predict_time(tp2, cpu(2, cal));
  CommCosts& c = cal.comm.at("2,2");
  c.corun_gemm = 1.5, c.sync_wait_s = 1e-4, c.sync_wait_fraction = 0.1;
  const TimeBreakdown with = predict_time(tp2, cpu(2, cal));
  EXPECT_NEAR(with.gemm, base.gemm * 1.5 * 1.1, 1e-9 * base.gemm);
  EXPECT_NEAR(with.attention, base.attention * 1.1, 1e-9 * base.attention);
  EXPECT_NEAR(with.elementwise, base.elementwise * 1.1, 1e-9 * base.elementwise);
  EXPECT_NEAR(with.optimizer, base.optimizer * 1.1, 1e-9 * base.optimizer);
  EXPECT_NEAR(with.tp_comm, base.tp_comm * 1.1, 1e-9 * base.tp_comm) << "1 ms + 0.1 ms a call";
  EXPECT_GT(with.iteration, base.iteration);

  // A pipeline whose first stage holds one layer of four: its rank computes about a third of
  // the time, so the slowest stage's GEMMs are slowed for that share only.
  const train::TrainConfig uneven =
      medium("--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 1", 2);
  Calibration plain = flat(2, 1e-9);  // the stages' time in their kernels, not in messages
  Calibration corun = plain;
  corun.comm.at("2,2").corun_gemm = 1.5;
  const double ratio =
      predict_time(uneven, cpu(2, corun)).gemm / predict_time(uneven, cpu(2, plain)).gemm;
  EXPECT_GT(ratio, 1.05);
  EXPECT_LT(ratio, 1.35);

  // Two ranks on one core: the same terms, inside the shared-cores bound (all ranks' work over
  // the cores).
  cal.cores = 1;
  Calibration none = cal;
  none.comm.at("2,2") = CommCosts{.bytes = c.bytes,
                                  .all_reduce_s = c.all_reduce_s,
                                  .reduce_scatter_s = c.reduce_scatter_s,
                                  .all_gather_s = c.all_gather_s,
                                  .p2p_s = c.p2p_s};
  const TimeBreakdown shared = predict_time(tp2, cpu(2, cal));
  const TimeBreakdown shared_none = predict_time(tp2, cpu(2, none));
  ASSERT_GT(shared_none.oversubscription, 0);
  EXPECT_NEAR(shared.gemm, shared_none.gemm * 1.5 * 1.1, 1e-9 * shared_none.gemm);
  EXPECT_GT(shared.iteration, shared_none.iteration * 1.1);
}

}  // namespace
}  // namespace trident::plan

// trident plan's per-rank memory against the peak resident memory of real `trident train`
// processes (mpirun, one process per rank); and `--calibrate-comm` under mpirun (PlanCli, end). The
// prediction covers trident's own tables; the rest of a process (binary, MPI, oneDNN and OpenMP
// runtimes, data indices) is measured once as the baseline of a tiny model under the same launcher,
// so the check is
//   |RSS - (baseline + predicted peak)| <= 4 MiB + 8% of the predicted peak (+ 2 layers),
// the slack covering what neither side counts: heap fragmentation of malloc'd vectors, oneDNN's
// GEMM packing buffers (which grow with the matrix sizes), MPI's per-peer shared-memory segments
// and the pages of the dataset indices touched; with ZeRO-2/3's per-layer reduce-scatters, Open
// MPI's own temporaries for them (up to two buffers of one layer's gradient, measured 7-12 MiB
// here for 7 MiB layers). Measured surplus +2 ... +11 MiB; the pipeline's first stage grew by about
// 4 MiB with the model-as-layers refactor and that growth is not traced yet (docs/plan.md).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "flat_calibration.h"
#include "trident/data/indexed_dataset.h"
#include "trident/plan/calibration.h"
#include "trident/plan/comm_calibration.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

class PlanRss : public ::testing::Test {
 protected:
  static fs::path dir() {
    return fs::temp_directory_path() / ("trident_plan_rss_" + std::to_string(::getpid()));
  }
  static void SetUpTestSuite() {
    fs::remove_all(dir());
    fs::create_directories(dir());
    data::IndexedDatasetBuilder builder((dir() / "corpus").string(), data::TokenDType::kU16);
    std::mt19937 rng(3);
    for (int doc = 0; doc < 400; ++doc) {
      std::vector<std::int32_t> ids(100 + doc % 53);
      for (auto& x : ids) x = static_cast<std::int32_t>(rng() % 1000);
      builder.add_sequence(ids);
      builder.end_document();
    }
    builder.finalize();
  }
  static void TearDownTestSuite() { fs::remove_all(dir()); }

  static std::string run(const std::string& cmd) {
    const std::string out = (dir() / "out.txt").string();
    const int rc = std::system((cmd + " > " + out + " 2>&1").c_str());
    std::ifstream in(out);
    std::stringstream s;
    s << in.rdbuf();
    EXPECT_EQ(rc, 0) << cmd << "\n" << s.str();
    return s.str();
  }

  static std::string launcher(int np) {
    std::string env =
        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
        "OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 ";
    return env + TRIDENT_MPIEXEC + " -np " + std::to_string(np) + " ";
  }

  // Peak RSS per rank from `trident train`'s closing log line.
  static std::vector<double> train_rss(int np, const std::string& flags) {
    const std::string log = run(
        launcher(np) + TRIDENT_CLI + " train " + flags +
        " --train-iters 1 --log-interval 1 --eval-iters 0 --hidden-dropout 0 --attention-dropout 0 "
        "--peak-tflops 1 --tokenizer-type NullTokenizer --vocab-size 1000"
        " --data-path " +
        (dir() / "corpus").string() + " --data-cache-path " + (dir() / "cache").string());
    std::smatch m;
    EXPECT_TRUE(std::regex_search(log, m, std::regex("peak RSS per rank \\[([0-9 ]+)\\] B")))
        << log;
    std::vector<double> out;
    std::istringstream in(m.size() > 1 ? m[1].str() : "");
    for (double x; in >> x;) out.push_back(x);
    EXPECT_EQ(static_cast<int>(out.size()), np);
    return out;
  }

  // Predicted peak per pipeline stage.
  static std::vector<double> plan_peak(int np, const std::string& flags) {
    const std::string out =
        run(std::string(TRIDENT_CLI) + " plan --gpu A100-80GB --num-gpus " + std::to_string(np) +
            " --format json --tokenizer-type NullTokenizer --vocab-size 1000"
            " --hidden-dropout 0 --attention-dropout 0 " +
            flags);
    const auto j = nlohmann::json::parse(out.substr(out.find('{')));
    std::vector<double> peaks;
    for (const auto& s : j["memory"]) peaks.push_back(s["peak"].get<double>());
    return peaks;
  }

  void expect_matches(int np, const std::string& flags, int tp_dp, double extra = 0) {
    const std::string tiny =
        "--num-layers 1 --hidden-size 16 --num-attention-heads 2 --seq-length 16 "
        "--micro-batch-size 1 --global-batch-size " +
        std::to_string(np) + " --make-vocab-size-divisible-by 8";
    static std::map<int, std::pair<std::vector<double>, std::vector<double>>> baselines;
    if (!baselines.count(np)) baselines[np] = {train_rss(np, tiny), plan_peak(np, tiny)};
    const std::vector<double>& base_rss = baselines[np].first;
    const std::vector<double>& base_plan = baselines[np].second;
    const std::vector<double> rss = train_rss(np, flags);
    const std::vector<double> peak = plan_peak(np, flags);
    ASSERT_EQ(rss.size(), static_cast<std::size_t>(np));
    ASSERT_EQ(base_rss.size(), static_cast<std::size_t>(np));
    for (int r = 0; r < np; ++r) {
      const std::size_t stage = static_cast<std::size_t>(r / tp_dp);
      ASSERT_LT(stage, peak.size());
      const double baseline = base_rss[static_cast<std::size_t>(r)] - base_plan[0];
      const double predicted = baseline + peak[stage];
      const double tol = 4.0 * 1024 * 1024 + 0.08 * peak[stage] + extra;
      EXPECT_NEAR(rss[static_cast<std::size_t>(r)], predicted, tol)
          << "rank " << r << ": measured " << rss[static_cast<std::size_t>(r)] / 1048576
          << " MiB, baseline " << baseline / 1048576 << " MiB + predicted " << peak[stage] / 1048576
          << " MiB";
      std::cerr << "[ rss ] rank " << r << " measured "
                << rss[static_cast<std::size_t>(r)] / 1048576 << " MiB, baseline "
                << baseline / 1048576 << " + predicted " << peak[stage] / 1048576 << " MiB\n";
    }
  }
};

// A model whose tables (about 60-250 MB per rank) dominate the process.
const std::string kModel =
    "--num-layers 4 --hidden-size 384 --num-attention-heads 4 --seq-length 128 "
    "--micro-batch-size 4 --global-batch-size 8 ";

TEST_F(PlanRss, SingleProcess) { expect_matches(1, kModel, 1); }
TEST_F(PlanRss, TensorParallel2) {
  expect_matches(2, kModel + "--tensor-model-parallel-size 2 --make-vocab-size-divisible-by 64", 2);
}
TEST_F(PlanRss, Pipeline2) { expect_matches(2, kModel + "--pipeline-model-parallel-size 2", 1); }
// One layer of kModel: 12 h^2 + 13 h parameters of 4 bytes.
constexpr double kLayerBytes = (12.0 * 384 * 384 + 13.0 * 384) * 4;
TEST_F(PlanRss, Zero3Dp2) { expect_matches(2, kModel + "--zero-stage 3", 2, 2 * kLayerBytes); }

// `mpirun -np 2 trident plan --gpu cpu --calibrate-comm` adds the measured collectives of a
// 2-rank job to an existing kernel calibration (here a hand-made one, as --calibrate would take
// 10-30 s), and the plan of a 2-rank layout then says it prices them from the measurement. Run
// without mpirun, or before any kernel calibration, it exits non-zero naming the fix.
class PlanCli : public PlanRss {
 protected:
  static int status(const std::string& cmd, std::string& output) {
    const std::string out = (dir() / "cli.txt").string();
    const int rc = std::system((cmd + " > " + out + " 2>&1").c_str());
    std::ifstream in(out);
    std::stringstream s;
    s << in.rdbuf();
    output = s.str();
    return rc;
  }
};

TEST_F(PlanCli, CalibrateCommMeasuresTheJobsCollectives) {
  const std::string cache = (dir() / "plan-cpu.json").string();
  const std::string comm =
      std::string(TRIDENT_CLI) +
      " plan --gpu cpu --threads-per-rank 1 --calibrate-comm --calibration-file " + cache;
  std::string out;
  EXPECT_NE(status(launcher(2) + comm, out), 0) << out;
  EXPECT_NE(out.find("run trident plan --gpu cpu --calibrate --threads-per-rank 1 first"),
            std::string::npos)
      << out;

  const plan::Calibration c = plan::testing::flat_kernels(2);
  plan::save_calibration(cache, c);

  EXPECT_NE(status(comm, out), 0) << "one process: nothing to time";
  EXPECT_NE(out.find("under mpirun"), std::string::npos) << out;

  const std::string table = run(launcher(2) + comm);
  EXPECT_NE(table.find("| 2,2 | 16777216 |"), std::string::npos) << table;
  plan::Calibration back;
  ASSERT_TRUE(plan::load_calibration(cache, 1, back));
  ASSERT_NE(back.comm_costs(2, 2), nullptr);
  EXPECT_EQ(back.comm_costs(2, 2)->bytes, plan::comm_calibration_sizes());
  EXPECT_NE(back.comm_costs(2, 2)->corun_gemm, 1.0) << "the ranks' interference, measured";
  EXPECT_NE(table.find("| ranks,group | GEMM with all ranks computing / alone"), std::string::npos)
      << table;
  EXPECT_EQ(back.grid, c.grid) << "the kernels' calibration is kept";

  const std::string layout =
      " --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 "
      "--micro-batch-size 1 --global-batch-size 2 --tokenizer-type NullTokenizer --vocab-size "
      "1000 --threads-per-rank 1 --calibration-file " +
      cache;
  for (const int np : {2, 4}) {
    const std::string plan_out =
        run(std::string(TRIDENT_CLI) + " plan --gpu cpu --num-gpus " + std::to_string(np) +
            " --tensor-model-parallel-size 2 --format json" + layout);
    const auto j = nlohmann::json::parse(plan_out.substr(plan_out.find('{')));
    EXPECT_EQ(j["collectives_measured"].get<bool>(), np == 2) << np;
  }
}

}  // namespace
}  // namespace trident

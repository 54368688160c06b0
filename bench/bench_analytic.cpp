// bench_analytic: wall-clock time of building analytic models (core::analytic_model) — the cost a sweep pays per
// model shape — from GPT-2 Medium to a 175B GPT on the machine presets. Prints one table; never asserts on time
// (docs/benchmarks.md, "bench_analytic", has results).
// Usage: bench_analytic [--min-time S]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/config/config.hpp"
#include "core/model/analytic.hpp"

using namespace harmony;

namespace {

using Clock = std::chrono::steady_clock;

struct Case {
  std::string name;
  core::AnalyticSpec spec;
  std::string machine;
};

core::AnalyticSpec gpt(int layers, int hidden, int heads, const char* name) {
  core::AnalyticSpec s;
  s.family = core::ModelFamily::Gpt;
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.seq_len = 2048;
  s.vocab = 50257;
  s.name = name;
  s.dtype = core::DType::Fp16;
  s.kernels = core::KernelStyle::Fused;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  double min_time_s = 0.5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--min-time") == 0 && i + 1 < argc) min_time_s = std::atof(argv[++i]);
  }
  std::vector<Case> cases;
  cases.push_back({"gpt2-medium fp32 eager, 6 sizes", *core::analytic_preset("gpt2-medium"), "paper-1080ti"});
  cases.push_back({"bert-large fp32 eager, 6 sizes", *core::analytic_preset("bert-large"), "paper-1080ti"});
  cases.push_back({"resnet152 fp32, 6 sizes", *core::analytic_preset("resnet152"), "a100-pcie-8x"});
  cases.push_back({"gpt 1.3B fp16 fused, 6 sizes", gpt(24, 2048, 16, "gpt-1.3b"), "rtx4090-4x"});
  cases.push_back({"gpt 13B fp16 fused, 6 sizes", gpt(40, 5120, 40, "gpt-13b"), "a100-pcie-8x"});
  core::AnalyticSpec g100 = gpt(80, 10240, 80, "gpt-100b");
  cases.push_back({"gpt 100B (80 x 10240) fp16 fused, 6 sizes", g100, "h100-sxm-8x"});
  g100.ubatch_sizes = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};
  cases.push_back({"gpt 100B (80 x 10240) fp16 fused, 12 sizes", g100, "h100-sxm-8x"});
  core::AnalyticSpec g100e = gpt(80, 10240, 80, "gpt-100b-eager");
  g100e.kernels = core::KernelStyle::Eager;
  cases.push_back({"gpt 100B (80 x 10240) fp16 eager, 6 sizes", g100e, "h100-sxm-8x"});
  cases.push_back({"gpt 175B (96 x 12288) fp16 fused, 6 sizes", gpt(96, 12288, 96, "gpt-175b"), "h100-sxm-8x"});

  fmt::print("{:<44} {:>7} {:>9} {:>8} {:>11} {:>11}\n", "case", "layers", "params", "repeats", "best (us)",
             "median (us)");
  for (const Case& c : cases) {
    const core::MachineSpec m = core::machine_preset(c.machine);
    std::vector<double> runs;
    double total = 0;
    std::int64_t params = 0;
    int layers = 0;
    while (total < min_time_s || runs.size() < 5) {
      const auto t0 = Clock::now();
      const core::Model model = core::analytic_model(c.spec, m.gpu_rates, m.cpu_adam);
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      runs.push_back(dt);
      total += dt;
      if (runs.size() == 1) {
        layers = model.num_layers();
        for (const core::Layer& l : model.layers) params += l.param_count;
      }
    }
    std::sort(runs.begin(), runs.end());
    fmt::print("{:<44} {:>7} {:>8.1f}B {:>8} {:>11.1f} {:>11.1f}\n", c.name, layers, static_cast<double>(params) / 1e9,
               runs.size(), runs.front() * 1e6, runs[runs.size() / 2] * 1e6);
  }
  return 0;
}

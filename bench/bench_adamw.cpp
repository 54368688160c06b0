// bench_adamw: the host optimizer's speed — AdamW over N parameters with adamw_update (scalar reference),
// adamw_update_vectorized (one thread) and ParallelAdamW for 1..nproc threads, in GB/s of parameters
// updated (4 bytes each) and of memory traffic (28 bytes per parameter: read p, g, m, v; write p, m, v).
// The tied rows: GPT-2's wte/lm_head update as the executor did it before (one thread sums the two gradients,
// the pool updates, one thread copies into the twin) and as ParallelAdamW::update_tied does it (one pass).
// Usage: bench_adamw [--params N] [--repeats R] [--max-threads T]   (defaults: 16M, 5, nproc)
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backend/adamw.hpp"
#include "backend/adamw_parallel.hpp"

using namespace harmony::backend;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::int64_t params = 16 * 1024 * 1024;
  int repeats = 5;
  int max_threads = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
};

// Median seconds of `repeats` calls of fn(step) (after one warm-up call that faults the pages in).
template <class F>
double median_seconds(int repeats, F&& fn) {
  std::int64_t step = 1;
  fn(step++);
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    fn(step++);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--params" && has_value) {
      o.params = std::atoll(argv[++i]);
    } else if (a == "--repeats" && has_value) {
      o.repeats = std::atoi(argv[++i]);
    } else if (a == "--max-threads" && has_value) {
      o.max_threads = std::atoi(argv[++i]);
    } else {
      fmt::print(stderr, "usage: bench_adamw [--params N] [--repeats R] [--max-threads T]\n");
      return 2;
    }
  }
  if (o.params < 1 || o.repeats < 1 || o.max_threads < 1) {
    fmt::print(stderr, "bench_adamw: --params, --repeats and --max-threads must be >= 1\n");
    return 2;
  }
  const auto n = static_cast<std::size_t>(o.params);
  std::vector<float> p(n, 0.5f), g(n, 1e-3f), m(n, 0.0f), v(n, 0.0f);
  const AdamWConfig config{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

  fmt::print(
      "AdamW over {} parameters ({:.0f} MiB of fp32 parameters, {:.0f} MiB with gradients and moments); "
      "median of {}; vector ISA {}\n",
      o.params, 4.0 * double(o.params) / (1 << 20), 16.0 * double(o.params) / (1 << 20), o.repeats, adamw_vector_isa());
  fmt::print("{:<28} {:>8} {:>12} {:>14} {:>13}\n", "variant", "threads", "time (ms)", "params GB/s", "traffic GB/s");
  // traffic: floats moved per parameter (AdamW: 7; the tied pair adds the second gradient and the twin's write,
  // and the serial form its summed buffer written and read again and the copy's read)
  const auto row = [&](const std::string& name, int threads, double s, double floats_per_param = 7.0) {
    const double params_gbs = 4.0 * double(o.params) / s / 1e9;
    fmt::print("{:<28} {:>8} {:>12.3f} {:>14.2f} {:>13.2f}\n", name, threads, s * 1e3, params_gbs,
               floats_per_param * params_gbs);
  };
  row("adamw_update (scalar ref)", 1, median_seconds(o.repeats, [&](std::int64_t step) {
        adamw_update(config, step, p.data(), g.data(), m.data(), v.data(), o.params);
      }));
  row("adamw_update_vectorized", 1, median_seconds(o.repeats, [&](std::int64_t step) {
        adamw_update_vectorized(config, step, p.data(), g.data(), m.data(), v.data(), o.params);
      }));
  for (int t = 1; t <= o.max_threads; ++t) {
    ParallelAdamW opt(t);
    row("ParallelAdamW", t, median_seconds(o.repeats, [&](std::int64_t step) {
          opt.update(config, step, p.data(), g.data(), m.data(), v.data(), o.params);
        }));
  }
  std::vector<float> g2(n, 2e-3f), twin(n, 0.0f), sum(n);
  ParallelAdamW pool(o.max_threads);
  row("tied: sum, update, copy", o.max_threads,
      median_seconds(o.repeats,
                     [&](std::int64_t step) {
                       for (std::size_t i = 0; i < n; ++i) sum[i] = g[i] + g2[i];
                       pool.update(config, step, p.data(), sum.data(), m.data(), v.data(), o.params);
                       std::copy(p.begin(), p.end(), twin.begin());
                     }),
      12.0);
  row("tied: update_tied", o.max_threads,
      median_seconds(o.repeats,
                     [&](std::int64_t step) {
                       pool.update_tied(config, step, p.data(), g.data(), g2.data(), m.data(), v.data(), o.params,
                                        twin.data());
                     }),
      9.0);
  return 0;
}

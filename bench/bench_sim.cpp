// bench_sim: wall-clock benchmark of harmony-sim (profile loading, one simulation, the event loop alone,
// full searches, and a whole `harmony-sim search` process on a 1,026-layer profile) on the bundled profiles
// and on synthetic deep models, compared with the paper's scheduler timings and the issues' targets. Prints
// one aligned table; never asserts on time (docs/benchmarks.md has results).
// Usage: bench_sim [SOURCE_ROOT] [--quick] [--min-time S] [--filter TEXT] [--harmony-sim PATH]
//        (root also from HARMONY_SOURCE_DIR; harmony-sim defaults to ../sim/harmony-sim next to this binary)
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/config/config.hpp"
#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "core/model/profile.hpp"
#include "core/model/profile_write.hpp"
#include "core/plan/plan.hpp"
#include "core/search/search.hpp"
#include "sim/engine/cost_reference.hpp"
#include "sim/engine/simulator.hpp"
#include "sim/study/compare.hpp"
#include "sim/study/evaluate.hpp"

extern char** environ;

using namespace harmony;

namespace {

using Clock = std::chrono::steady_clock;

// The paper's scheduler timings on the 2-core reference machine (from the issue).
constexpr double kPaperBertPpS = 1.1;       // bert_large D32 vPP N2, 121 candidates
constexpr double kPaperDeepCnnMinS = 38.0;  // 400-500-layer CNN searches: 38-90 s; the low end is used
constexpr double kSearchSpeedupTarget = 100.0;
constexpr double kSingleSimTargetS = 5e-3;  // one simulation of a 500-layer model
constexpr double kProcessTargetS = 30e-3;   // a whole harmony-sim search process on 1,026 layers (issue 12)
constexpr int kDeepGpt2Layers = 1026;

const std::vector<std::string> kDefaultFwd{"greedy_reverse_addx", "balanced_addx", "reuse", "balanced_time"};
const std::vector<std::string> kDefaultBwd{"greedy_reverse_addx", "balanced_addx", "balanced_time"};
const std::vector<std::string> kScriptFwd{"balanced_time", "reuse"};  // the paper's published scripts
const std::vector<std::string> kScriptBwd{"balanced_time"};

struct Options {
  std::string root = ".";
  bool quick = false;
  std::string filter;       // run only the cases whose name contains this
  double min_time_s = 0.5;  // each case repeats until it has run this long in total
  int min_reps = 3;
  std::string harmony_sim;  // the binary the whole-process case spawns
};

// What one run of a case did (identical on every repeat).
struct Work {
  int layers = 0;
  std::size_t candidates = 0;  // 0 for non-search cases
  std::size_t ops = 0;         // ops in the simulated programs
  std::size_t events = 0;      // completion events the simulator processed
  std::size_t deadlocked = 0;
  std::string note;
};

struct Row {
  std::string name;
  Work work;
  int reps = 0;
  double best_s = 0.0;
  double first_s = 0.0;            // the first (cold) run: fresh heap pages, cold caches
  std::optional<double> paper_s;   // the paper's time for this search, if known
  std::optional<double> target_s;  // an absolute target (single simulation), if any
};

// Runs `f` until it has run opts.min_time_s in total and at least opts.min_reps times; keeps the best.
template <typename F>
Row measure(const Options& opts, std::string name, F&& f) {
  Row row;
  row.name = std::move(name);
  double total = 0.0;
  row.best_s = 1e300;
  do {
    const auto t0 = Clock::now();
    row.work = f();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    row.best_s = std::min(row.best_s, dt);
    if (row.reps == 0) row.first_s = dt;
    total += dt;
    ++row.reps;
  } while ((total < opts.min_time_s || row.reps < opts.min_reps) && row.reps < 1000000);
  fmt::print(stderr, "  {:<44} best {:>10.3f} ms over {} runs\n", row.name, row.best_s * 1e3, row.reps);
  return row;
}

// ----------------------------------------------------------------------------------------------
// Synthetic deep models. bert_large's 28 layers are: 0 embeddings, 1..24 encoder layers, 25 pooler,
// 26 classifier, 27 criterion. Encoders 1..23 all take and produce the same hidden state (input
// 2099200 B/sample); encoder 24 outputs the pooler's input. A deep BERT of R layers keeps the
// embeddings first, then R-5 copies of encoders 1..23 taken cyclically, then encoder 24, the pooler,
// the classifier and the criterion: every layer's input size still equals its predecessor's output.
core::Model make_deep_bert(const core::Model& bert, int num_layers) {
  if (bert.num_layers() != 28) throw core::ScheduleError("make_deep_bert expects bert_large's 28 layers");
  if (num_layers < 5) throw core::ScheduleError("a deep BERT needs at least 5 layers");
  core::Model m;
  m.name = fmt::format("{}_deep{}", bert.name, num_layers);
  m.source = bert.source + " (synthetic: encoders 1..23 replicated)";
  m.ubatch_fwd = bert.ubatch_fwd;
  m.ubatch_bwd = bert.ubatch_bwd;
  m.layers.reserve(static_cast<std::size_t>(num_layers));
  m.layers.push_back(bert.layers[0]);
  for (int i = 0; i < num_layers - 5; ++i) m.layers.push_back(bert.layers[static_cast<std::size_t>(1 + i % 23)]);
  for (std::size_t l = 24; l < 28; ++l) m.layers.push_back(bert.layers[l]);
  for (std::size_t l = 0; l + 1 < m.layers.size(); ++l) m.layers[l].name = fmt::format("vlayer{}", l);
  m.validate();
  return m;
}

// A deep GPT-2 Medium of R layers: layer 0 (embeddings), R - 4 copies of layer 1 (a transformer block), then
// the last three layers (final blocks' tail, head, criterion), every layer renamed vlayer<i>; the same model
// the lead's make-deep-profile.py writes (docs/benchmarks.md).
core::Model make_deep_gpt2(const core::Model& gpt2, int num_layers) {
  if (gpt2.num_layers() < 5) throw core::ScheduleError("make_deep_gpt2 expects gpt2_medium's 28 layers");
  core::Model m;
  m.name = gpt2.name;
  m.ubatch_fwd = gpt2.ubatch_fwd;
  m.ubatch_bwd = gpt2.ubatch_bwd;
  m.layers.push_back(gpt2.layers[0]);
  for (int i = 0; i < num_layers - 4; ++i) m.layers.push_back(gpt2.layers[1]);
  for (std::size_t l = gpt2.layers.size() - 3; l < gpt2.layers.size(); ++l) m.layers.push_back(gpt2.layers[l]);
  for (std::size_t l = 0; l < m.layers.size(); ++l) m.layers[l].name = fmt::format("vlayer{}", l);
  m.validate();
  return m;
}

// One run of a child process: wall time from spawn to reaped, and the CPU time it used (user + system).
struct ProcessRun {
  double wall_s = 0.0;
  double cpu_s = 0.0;
};

ProcessRun spawn_once(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  const auto t0 = Clock::now();
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw core::ScheduleError(fmt::format("cannot start {}: {}", args[0], std::strerror(rc)));
  int status = 0;
  rusage ru{};
  if (wait4(pid, &status, 0, &ru) != pid) throw core::ScheduleError(fmt::format("wait4 on {} failed", args[0]));
  ProcessRun r;
  r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  r.cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
            static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw core::ScheduleError(fmt::format("{} failed (status {})", args[0], status));
  return r;
}

// ../sim/harmony-sim next to this binary (build/bench/bench_sim -> build/sim/harmony-sim).
std::string default_harmony_sim() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "harmony-sim";
  return (self.parent_path().parent_path() / "sim" / "harmony-sim").string();
}

// ----------------------------------------------------------------------------------------------
// Cases.

core::SearchSpace make_space(core::PlanKind mode, int gpus, int minibatch, const std::vector<std::string>& fwd,
                             const std::vector<std::string>& bwd, int threads) {
  core::SearchSpace s;
  s.kind = mode;
  s.gpus = gpus;
  s.minibatch = minibatch;
  s.capacity_bytes = 10 * core::kGiB;
  s.spec.packing_fwd = fwd;
  s.spec.packing_bwd = bwd;
  s.spec.threads = threads;
  s.spec.top_k = 5;
  return s;
}

// One full search as harmony-sim runs it: enumerate (packing included), evaluate all, rank.
Work search_once(const core::Model& model, const core::MachineSpec& machine, const core::SearchSpace& space) {
  const auto cands = core::enumerate_candidates(model, space);
  std::atomic<std::size_t> ops{0};
  std::atomic<std::size_t> events{0};
  const auto res = core::run_search(cands, space, [&](const core::Plan& p) {
    auto e = sim::evaluate_plan(model, machine, p, core::LowerOptions{});
    ops += e.program.ops.size();
    events += e.timeline.events_processed;
    return std::move(e.report);
  });
  Work w;
  w.layers = model.num_layers();
  w.candidates = res.num_candidates;
  w.ops = ops.load();
  w.events = events.load();
  w.deadlocked = res.num_deadlocked;
  if (!res.ranked.empty()) {
    const auto& top = res.ranked.front().report;
    w.note = fmt::format("Top1 {:.3f} s, u {}/{}, bwd packs {}", top.iteration_time_s, top.plan.u_fwd, top.plan.u_bwd,
                         top.plan.packs_bwd.size());
  } else {
    w.note = "no feasible candidate";
  }
  return w;
}

Work simulate_once(const core::Model& model, const core::MachineSpec& machine, const core::Plan& plan) {
  const auto e = sim::evaluate_plan(model, machine, plan, core::LowerOptions{});
  Work w;
  w.layers = model.num_layers();
  w.ops = e.program.ops.size();
  w.events = e.timeline.events_processed;
  w.note = fmt::format("iteration {:.3f} s{}", e.report.iteration_time_s, e.report.deadlock ? ", DEADLOCK" : "");
  return w;
}

// ----------------------------------------------------------------------------------------------
// Output.

std::string fmt_time(double s) {
  if (s >= 1.0) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.2f} us", s * 1e6);
}

std::string fmt_count(std::size_t n) { return n == 0 ? "-" : fmt::format("{}", n); }

std::string verdict(const Row& r) {
  if (r.paper_s) return r.best_s * kSearchSpeedupTarget <= *r.paper_s ? "PASS (>=100x)" : "FAIL (<100x)";
  if (r.target_s) {
    const std::string t = fmt_time(*r.target_s);
    return r.best_s < *r.target_s ? "PASS (<" + t + ")" : "FAIL (>=" + t + ")";
  }
  return "";
}

void print_table(const std::vector<Row>& rows) {
  std::size_t w = 4;
  for (const auto& r : rows) w = std::max(w, r.name.size());
  fmt::print("{:<{}}  {:>6}  {:>5}  {:>8}  {:>7}  {:>11}  {:>11}  {:>11}  {:>10}  {:>8}  {:>9}  {}\n", "case", w,
             "layers", "cands", "ops", "repeats", "first run", "best wall", "per cand", "Mevents/s", "paper", "speedup",
             "target");
  for (const auto& r : rows) {
    const std::string per_cand =
        r.work.candidates ? fmt_time(r.best_s / static_cast<double>(r.work.candidates)) : std::string("-");
    const std::string eps =
        r.work.events ? fmt::format("{:.2f}", static_cast<double>(r.work.events) / r.best_s / 1e6) : std::string("-");
    const std::string paper = r.paper_s ? fmt::format("{:.1f} s", *r.paper_s) : std::string("-");
    const std::string speedup = r.paper_s ? fmt::format("{:.0f}x", *r.paper_s / r.best_s) : std::string("-");
    fmt::print("{:<{}}  {:>6}  {:>5}  {:>8}  {:>7}  {:>11}  {:>11}  {:>11}  {:>10}  {:>8}  {:>9}  {}\n", r.name, w,
               r.work.layers, fmt_count(r.work.candidates), fmt_count(r.work.ops), r.reps, fmt_time(r.first_s),
               fmt_time(r.best_s), per_cand, eps, paper, speedup, verdict(r));
  }
}

Options parse_args(int argc, char** argv) {
  Options o;
  if (const char* env = std::getenv("HARMONY_SOURCE_DIR")) o.root = env;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      o.quick = true;
    } else if (std::strcmp(argv[i], "--min-time") == 0 && i + 1 < argc) {
      o.min_time_s = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--filter") == 0 && i + 1 < argc) {
      o.filter = argv[++i];
    } else if (std::strcmp(argv[i], "--harmony-sim") == 0 && i + 1 < argc) {
      o.harmony_sim = argv[++i];
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      fmt::print(
          "usage: bench_sim [SOURCE_ROOT] [--quick] [--min-time SECONDS] [--filter TEXT] [--harmony-sim PATH]\n"
          "  SOURCE_ROOT   the harmony source tree (default $HARMONY_SOURCE_DIR, else .)\n"
          "  --quick       one run per case (smoke test; times are cold and noisy)\n"
          "  --min-time S  repeat each case until it has run S seconds in total (default 0.5)\n"
          "  --filter TEXT run only the cases whose name contains TEXT\n"
          "  --harmony-sim PATH  the binary of the whole-process case (default ../sim/harmony-sim next to\n"
          "                this one)\n");
      std::exit(0);
    } else if (argv[i][0] == '-') {
      throw core::ScheduleError(fmt::format("unknown option '{}' (try --help)", argv[i]));
    } else {
      o.root = argv[i];
    }
  }
  if (o.harmony_sim.empty()) o.harmony_sim = default_harmony_sim();
  if (o.quick) {
    o.min_time_s = std::min(o.min_time_s, 0.0);
    o.min_reps = 1;
  }
  return o;
}

int run(const Options& opts) {
  const std::string bert_path = opts.root + "/configs/profiles/bert_large.json";
  const std::string gpt2_path = opts.root + "/configs/profiles/gpt2_medium.json";
  const core::MachineSpec machine;  // the paper-1080ti constants (defaults of MachineSpec)
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  std::vector<Row> rows;
  std::vector<std::string> notes;
  auto note = [&](const Row& r) {
    if (!r.work.note.empty()) notes.push_back(fmt::format("{}: {}", r.name, r.work.note));
    if (r.work.deadlocked) notes.push_back(fmt::format("{}: {} deadlocked candidates", r.name, r.work.deadlocked));
  };
  fmt::print(stderr, "bench_sim: root {}, {} hardware threads{}\n", opts.root, hw, opts.quick ? ", --quick" : "");
  auto selected = [&](const std::string& name) { return name.find(opts.filter) != std::string::npos; };

  // Profile loading (JSON parse + validation).
  for (const auto& [label, path] :
       {std::pair{"load profile bert_large.json", bert_path}, std::pair{"load profile gpt2_medium.json", gpt2_path}}) {
    if (!selected(label)) continue;
    rows.push_back(measure(opts, label, [&] {
      const auto m = core::load_profile(path);
      Work w;
      w.layers = m.num_layers();
      return w;
    }));
  }
  const auto bert = core::load_profile(bert_path);
  const auto gpt2 = core::load_profile(gpt2_path);

  const std::string all = fmt::format("{} thr", hw);
  struct SearchCase {
    std::string name;
    const core::Model* model;
    core::PlanKind kind;
    int minibatch;
    const std::vector<std::string>* fwd;
    const std::vector<std::string>* bwd;
    std::optional<double> paper_s;
    std::optional<std::size_t> expect_candidates;  // the paper scheduler's count, where known
  };
  std::vector<SearchCase> searches{
      {"search bert_large pp D32 N2 default", &bert, core::plan_kind("harmony-pp"), 32, &kDefaultFwd, &kDefaultBwd,
       kPaperBertPpS, 121},
      {"search bert_large dp D32 N2 default",
       &bert,
       core::plan_kind("harmony-dp"),
       32,
       &kDefaultFwd,
       &kDefaultBwd,
       {},
       {}},
      {"search gpt2_medium pp D16 N2 default",
       &gpt2,
       core::plan_kind("harmony-pp"),
       16,
       &kDefaultFwd,
       &kDefaultBwd,
       {},
       {}},
  };
  auto run_searches = [&](const std::vector<SearchCase>& cases) {
    for (const auto& c : cases) {
      for (int threads : {1, 0}) {
        const auto space = make_space(c.kind, 2, c.minibatch, *c.fwd, *c.bwd, threads);
        const std::string name = fmt::format("{}, {}", c.name, threads == 1 ? std::string("1 thr") : all);
        if (!selected(name)) continue;
        Row r = measure(opts, name, [&] { return search_once(*c.model, machine, space); });
        if (c.expect_candidates && r.work.candidates != *c.expect_candidates) {
          notes.push_back(fmt::format("WARNING: {}: {} candidates, the paper's scheduler evaluates {}", name,
                                      r.work.candidates, *c.expect_candidates));
        }
        r.paper_s = c.paper_s;
        note(r);
        rows.push_back(std::move(r));
      }
    }
  };
  run_searches(searches);

  // Synthetic deep models: one simulation of a fixed plan, then the paper scripts' search.
  std::vector<core::Model> deep;
  for (int layers : {400, 500}) deep.push_back(make_deep_bert(bert, layers));
  for (const auto& m : deep) {
    core::Plan plan;
    plan.kind = core::plan_kind("harmony-pp");
    plan.gpus = 2;
    plan.minibatch = 32;
    plan.u_fwd = 4;
    plan.u_bwd = 4;
    core::manual_packs(m.num_layers(), 8, plan.packs_fwd, plan.packs_bwd);
    const std::string name = fmt::format("simulate deep_bert{} pp D32 N2 u4/4 P8", m.num_layers());
    if (!selected(name)) continue;
    Row r = measure(opts, name, [&] { return simulate_once(m, machine, plan); });
    if (m.num_layers() >= 500) r.target_s = kSingleSimTargetS;
    note(r);
    rows.push_back(std::move(r));
    // The event loop alone (sim::run_timeline) on the same Program and durations, lowered and priced once.
    const std::string loop_name = fmt::format("event loop deep_bert{} pp D32 N2 u4/4 P8", m.num_layers());
    if (!selected(loop_name)) continue;
    const auto e = sim::evaluate_plan(m, machine, plan, core::LowerOptions{});
    const auto durations = sim::ReferenceCostModel(m, machine).durations(e.program);
    Row loop = measure(opts, loop_name, [&] {
      const auto t = sim::run_timeline(e.program, durations);
      Work w;
      w.layers = m.num_layers();
      w.ops = e.program.ops.size();
      w.events = t.events_processed;
      return w;
    });
    rows.push_back(std::move(loop));
  }
  std::vector<SearchCase> deep_searches;
  for (const auto& m : deep) {
    deep_searches.push_back({fmt::format("search deep_bert{} pp D32 N2 bt+reuse/bt", m.num_layers()),
                             &m,
                             core::plan_kind("harmony-pp"),
                             32,
                             &kScriptFwd,
                             &kScriptBwd,
                             kPaperDeepCnnMinS,
                             {}});
  }
  run_searches(deep_searches);

  // A whole `harmony-sim search` process on a 1,026-layer GPT-2 Medium profile (3 MB of JSON): start-up,
  // profile parsing, enumeration, evaluation, bottleneck analysis, printing (target: 30 ms).
  {
    const std::string name = fmt::format("process harmony-sim search gpt2 x{} pp D16", kDeepGpt2Layers);
    if (selected(name)) {
      const auto dir = std::filesystem::temp_directory_path() / fmt::format("harmony_bench_{}", ::getpid());
      std::filesystem::create_directories(dir);
      const auto profile = dir / "deep_gpt2.json";
      const auto config = dir / "search.yaml";
      std::ofstream(profile) << core::write_profile_json(make_deep_gpt2(gpt2, kDeepGpt2Layers));
      std::ofstream(config) << "model:\n  profile: " << profile.string()
                            << "\nmachine: paper-1080ti\nplan:\n  mode: harmony-pp\n  gpus: 2\n  minibatch: 16\n"
                               "search:\n  packing_fwd: [balanced_time, reuse]\n  packing_bwd: [balanced_time]\n"
                               "  top_k: 5\n";
      double best_cpu_s = 1e300;
      try {
        Row r = measure(opts, name, [&] {
          const ProcessRun run = spawn_once({opts.harmony_sim, "search", config.string()});
          best_cpu_s = std::min(best_cpu_s, run.cpu_s);
          Work w;
          w.layers = kDeepGpt2Layers;
          return w;
        });
        r.work.note = fmt::format(
            "{}: best CPU time (user + system) {:.1f} ms; best wall includes waiting for "
            "a CPU on a loaded machine",
            opts.harmony_sim, best_cpu_s * 1e3);
        r.target_s = kProcessTargetS;
        note(r);
        rows.push_back(std::move(r));
      } catch (const core::Error& e) {
        notes.push_back(fmt::format("{}: skipped: {}", name, e.what()));
      }
      std::filesystem::remove_all(dir);
    }
  }

  // harmony-sim compare on the 500-layer model: every plan kind searched with the native cost model
  // on the paper's 1080 Ti preset (target: under 2 s).
  {
    const auto preset = core::machine_preset("paper-1080ti");
    const auto& m = deep.back();
    const std::string name = fmt::format("compare deep_bert{} N2 D32 native, 6 kinds", m.num_layers());
    if (selected(name)) {
      core::SearchSpec spec;
      spec.packing_fwd = kScriptFwd;
      spec.packing_bwd = kScriptBwd;
      Row r = measure(opts, name, [&] {
        const auto res = sim::compare_plan_kinds(m, preset, 2, 32, core::CostModelKind::Native, spec, core::Options{});
        Work w;
        w.layers = m.num_layers();
        std::string best;
        for (const auto& k : res.kinds) {
          w.candidates += k.candidates;
          if (k.feasible) best += fmt::format("{} {:.2f} s; ", core::plan_kind_name(k.kind), k.best.iteration_time_s);
        }
        w.note = best;
        return w;
      });
      r.target_s = 2.0;
      note(r);
      rows.push_back(std::move(r));
    }
  }

  fmt::print("\n");
  print_table(rows);
  fmt::print("\n");
  for (const auto& n : notes) fmt::print("  {}\n", n);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_sim: error: {}\n", e.what());
    return 2;
  }
}

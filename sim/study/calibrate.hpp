// `harmony-sim calibrate`: fits a machine's free native-model parameters (shared compute, the profile's time
// scales, per-class dispatch overheads, copy bandwidth) to measured runs of known Programs (harmony-run's
// trace of the last step, optionally its step times), and writes them back into the machine file with a
// provenance comment. docs/validation.md#calibrate describes the fit.
#pragma once

#include <string>
#include <vector>

#include "core/machine/machine.hpp"
#include "core/model/model.hpp"
#include "core/program/program.hpp"

namespace harmony::sim {

// The classes an op's time is fitted and reported by.
enum class OpClass : std::uint8_t { Compute, Copy, P2P, Update, Del };
inline constexpr int kNumOpClasses = 5;
const char* op_class_name(OpClass c);  // "compute", "copy", "p2p", "update", "del"
// FWD/REC/BWD: compute; Update; DEL; a P2P pair or a collective (ARD, AG, RS): p2p; every other op: copy.
OpClass op_class(const core::Program& program, int op);

// One op's measured begin and duration (seconds from the trace's first op).
struct MeasuredOps {
  std::vector<double> begin_s;  // per program op
  std::vector<double> dur_s;
  double span_s = 0;  // last end - first begin
};

// Reads harmony-run's Chrome trace (`harmony-run train --trace`) of `program`: every "X" event is matched to the
// op with its device (pid) and id (args.id), and must agree on kind, layers and bytes. Throws core::ConfigError
// located in the trace (file:line:column) for a file that is no trace, a trace without timings, or a trace of
// another Program (another model, plan or lowering).
MeasuredOps read_measured_trace(const std::string& path, const std::string& text, const core::Program& program);

// compute.host_cores: each op's measured slowdown when the ops running at each instant of `measured` share
// `units` host cores max-min fairly (a compute op or a copy wants one unit, an update all of them, a DEL and a
// P2P receive none): the time average over the op's interval of want / fair rate; 1 for ops that want none.
std::vector<double> host_slowdowns(const core::Program& program, const MeasuredOps& measured, double units);

struct CalibrationRun {
  std::string name;  // shown in reports (the config's file name)
  const core::Program* program = nullptr;
  const core::Model* model = nullptr;
  core::MachineSpec machine;  // the machine being fitted, with the run's gpu_memory
  MeasuredOps measured;
  double measured_step_s = 0;  // the measured time per step (a run's mean; else the trace's span)
};

struct ClassResidual {
  OpClass cls = OpClass::Compute;
  int ops = 0;
  double measured_s = 0;   // sum of the class's measured op durations
  double predicted_s = 0;  // ... and of the fitted engine's
  double rms_op_s = 0;     // RMS of measured - predicted per op
};

struct RunResidual {
  std::string name;
  int ops = 0;
  double measured_step_s = 0;
  double predicted_step_s = 0;         // the fitted machine's native iteration time
  std::vector<ClassResidual> classes;  // classes with ops only
};

struct Calibration {
  core::ComputeSharing compute;
  core::DispatchOverheads dispatch;
  bool bandwidth_fitted = false;  // false: the copy times do not grow with bytes, or the machine has a topology
  double copy_bytes_per_s = 0;    // the fitted bandwidth (bw_swap, bw_p2p and bw_msg) when bandwidth_fitted
  std::vector<RunResidual> runs;
  std::vector<ClassResidual> classes;  // over every run
  std::vector<std::string> notes;      // what was not fitted, and why
};

// The fit: (1) per class, least squares over the measured op durations: compute = dispatch.compute +
// time_scale x profiled time x the measured processor-sharing slowdown for each candidate number of units;
// copy and p2p = their dispatch + bytes moved / bandwidth (one bandwidth); update = dispatch.update +
// update_time_scale x profiled time x the measured number of updates sharing the cores; with compute.host_cores
// (copies, updates and dispatch on the same cores) each class's duration is first divided by its measured
// slowdown among all host work, and copies more than 3 median residuals above the fit are dropped (twice);
// (2) the sharing (host cores with the machine's units when it gives them, else the candidates of calibrate.cpp),
// a factor on time_scale (2^(k/20), k = -20..20) and one on dispatch.compute (0, 0.5, .., 3) that minimise the
// sum over runs of the squared relative step error (first minimum in that order). With host cores compute.wake is
// measured, not fitted: the mean gap from an op's last predecessor's end to its begin over the runs' traces.
// Deterministic; throws core::ConfigError when no run is given.
Calibration calibrate(const std::vector<CalibrationRun>& runs);

// No fit: each run's prediction on its own machine (compute and dispatch as given), with the residuals.
Calibration check_machine(const std::vector<CalibrationRun>& runs);

// `machine` with the fitted values.
core::MachineSpec apply_calibration(core::MachineSpec machine, const Calibration& c);

// The machine file's text with the fitted keys (compute, dispatch and, when fitted, bw_swap/bw_p2p/bw_msg)
// replaced: their old top-level entries and earlier "# calibrate:" lines are dropped, and the new values
// are appended after `provenance` (lines written as "# calibrate: ..." comments).
std::string calibrated_machine_text(const std::string& original, const Calibration& c,
                                    const std::vector<std::string>& provenance);

// FNV-1a 64 of `text`, as 16 hex digits: the inputs' fingerprint in the provenance comment.
std::string fingerprint(const std::string& text);

}  // namespace harmony::sim

// What `harmony-run probe` makes of its measurements (probe.hpp): the machine keys it writes (and why it writes no
// others), the machine YAML (the base machine by reference plus the measured keys, each with its provenance in a
// comment), the JSON document (schemas/probe.schema.json) and the table.
#pragma once

#include <string>
#include <vector>

#include "backend/probe/probe.hpp"
#include "core/machine/machine.hpp"

namespace harmony::backend {

// The machine the probe's keys go on top of (--base).
struct ProbeBase {
  std::string given;     // as on the command line: a preset name or a path
  bool preset = false;   // a built-in preset; else a machine file
  std::string yaml_ref;  // what the machine file names: the preset, or the file's path from the written file's folder
  core::MachineSpec machine;
};

// One machine key the probe is about: the value it writes, or why it writes none.
struct ProbeMachineKey {
  std::string key;         // "cpu_adam.bandwidth", "host_paths.pinned_h2d", "topology.nvme.read"
  std::string value;       // as written ("5.123GB/s"); empty when not written
  std::string base_value;  // the base machine's, in the same units; empty when it has none
  std::string note;        // written: what was timed, best of how many, spread; else why not
  bool written() const { return !value.empty(); }
};

// Every key of cpu_adam, host_paths, topology.host_memcpy, topology.pinned_limit and topology.nvme, in that order.
std::vector<ProbeMachineKey> probe_machine_keys(const ProbeResult& r, const ProbeBase& base);

// The machine file: `preset:` or `file:` the base, then the written keys; a machine harmony-sim loads as it is.
// `command` is the command line, for the header.
std::string probe_machine_yaml(const ProbeResult& r, const ProbeBase& base, const std::string& command);
// The --format json document; `out_path` empty: no machine file written.
std::string probe_json(const ProbeResult& r, const ProbeBase& base, const std::string& out_path);
std::string probe_table(const ProbeResult& r, const ProbeBase& base, const std::string& out_path);

// The machine file's spellings: a bandwidth with 4 significant digits in decimal units ("5.123GB/s", "812.4MB/s"),
// a size in MiB when whole ("1024MiB", else "…B") and a duration in microseconds ("85.2us"). Each reads back
// (core::parse_bandwidth, parse_bytes, parse_duration_s) within half a unit of its last digit.
std::string yaml_bandwidth(double bytes_per_s);
std::string yaml_size(core::Bytes bytes);
std::string yaml_duration(double seconds);

}  // namespace harmony::backend

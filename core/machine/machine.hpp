// The machine a plan runs on. The reference cost model reads only the paper's scheduler constants
// (GPU count and memory, swap/P2P/CPU-message bandwidths, per-task free time); the native cost model
// reads the Topology: the PCIe tree, GPU-to-GPU paths, copy engines, host memory and CPU cores.
#pragma once

#include <string>
#include <vector>

#include "core/base/units.hpp"

namespace harmony::core {

// A PCIe switch (or a CPU root port) that GPUs hang off; its uplink goes to one CPU socket.
struct PcieSwitch {
  std::string name;
  int socket = 0;
  double uplink_bytes_per_s = 0;  // per direction
};

struct GpuSpec {
  int pcie_switch = 0;          // index into Topology::switches
  double link_bytes_per_s = 0;  // the GPU's own PCIe link, per direction
  int copy_engines_h2d = 1;     // concurrent host->device copies
  int copy_engines_d2h = 1;     // concurrent device->host copies
};

struct NvLink {
  int gpu_a = 0;
  int gpu_b = 0;
  double bytes_per_s = 0;  // per direction
};

enum class P2PMode {
  Pcie,  // GPU-to-GPU copies go through the PCIe tree (switch, or root complex across switches)
  Host,  // no P2P: staged through pinned host memory (device->host, then host->device)
};

// An NVMe offload tier (docs/machines.md, `topology.nvme`): the drive array behind the host, read and written
// through pinned host buffers. Bandwidths are the array's aggregate per direction; latency is paid per I/O.
struct NvmeSpec {
  double read_bytes_per_s = 0;   // 0 = no NVMe tier
  double write_bytes_per_s = 0;  // 0 = no NVMe tier
  Bytes capacity_bytes = 0;      // 0 = unlimited
  double latency_s = 0;          // per I/O (one bucket or one layer's read or write)
  bool present() const { return read_bytes_per_s > 0 && write_bytes_per_s > 0; }
};

struct Topology {
  std::vector<GpuSpec> gpus;  // size == MachineSpec::gpus
  std::vector<PcieSwitch> switches;
  int sockets = 1;
  double inter_socket_bytes_per_s = 0;  // per direction (QPI/UPI/Infinity Fabric)
  P2PMode p2p = P2PMode::Pcie;
  std::vector<NvLink> nvlinks;         // pairs with a direct NVLink (take precedence over PCIe)
  double transfer_latency_s = 0;       // fixed cost added to every transfer
  Bytes host_memory_bytes = 0;         // 0 = unlimited
  Bytes pinned_limit_bytes = 0;        // 0 = unlimited
  double host_memcpy_bytes_per_s = 0;  // CPU-side copies (CPU messages, staging)
  // DRAM bandwidth shared by DMA (swaps, NVMe I/O), host copies and the CPU optimizer; 0 = unlimited
  double host_memory_bytes_per_s = 0;
  NvmeSpec nvme;           // absent (not present()) = no NVMe tier
  int cpu_cores = 1;       // cores the optimizer may use
  double free_time_s = 0;  // time to free one pack's tensors (paper: flat 40 ms)
  bool valid() const { return !gpus.empty(); }
};

// What the analytic models (core/model/analytic.hpp) price a layer with: one GPU's peak rates, how close real
// kernels come to them, and the framework's fixed costs (docs/machines.md, `gpu_rates`). Zero = not given.
struct GpuRates {
  double matrix_fp32_flops_per_s = 0;  // dense FP32 GEMM peak (CUDA cores; no TF32)
  double matrix_fp16_flops_per_s = 0;  // dense FP16/BF16 GEMM peak with FP32 accumulation (tensor cores)
  // dense TF32 GEMM peak (tensor cores, FP32 storage and accumulation; Ampere and later): what an FP32 model's GEMMs
  // run at with TF32 allowed (AnalyticSpec::tf32); 0 = the GPU has none (V100, Pascal)
  double matrix_tf32_flops_per_s = 0;
  double memory_bytes_per_s = 0;   // DRAM bandwidth
  double gemm_efficiency_max = 0;  // eff_max: the fraction of the peak a large GEMM reaches
  double gemm_half_flops = 0;      // a GEMM of this many FLOPs reaches eff_max / 2
  // The same two for FP32 GEMMs on the CUDA cores (matrix_fp32), where a machine's tensor-core efficiency does not
  // carry (gemm_efficiency_fp32); 0 = gemm_efficiency_max / gemm_half_flops serve both peaks.
  double gemm_fp32_efficiency_max = 0;
  double gemm_fp32_half_flops = 0;
  // The fraction of matrix_fp16 the best GEMM reaches, measured by a GEMM microbenchmark (the maximum achievable
  // matmul FLOPS, MAMF); what a hand-written engine's GEMMs reach (AnalyticSpec::trainer Engine). 0 = not measured.
  double gemm_ceiling = 0;
  double vector_efficiency = 0;    // fraction of memory_bytes_per_s elementwise and reduction kernels reach
  double kernel_floor_s = 0;       // the least time one kernel takes (launch and framework dispatch)
  double forward_overhead_s = 0;   // fixed cost of one layer's forward call
  double backward_overhead_s = 0;  // fixed extra cost of one layer's backward call (autograd)
  bool valid() const { return matrix_fp32_flops_per_s > 0 && memory_bytes_per_s > 0; }
};

// The host-side optimizer step the analytic models charge per layer: Adam(W) over the layer's FP32
// parameters at `bytes_per_s` of parameters, plus a fixed `per_layer_s`. Zero = the documented default.
// bf16_bytes_per_s / fp16_bytes_per_s: the same step when the gradients arrive and the updated weights leave in
// that 2-byte type, the casts fused into the step (DeepSpeed's CPU Adam; `harmony-run probe` measures them), in FP32
// parameter bytes per second; 0 = not given (bytes_per_s prices such a layer, as before).
// torch_bytes_per_s: the step as PyTorch's own torch.optim.AdamW runs it on CPU tensors (a model with cpu_optimizer:
// torch), FP32 parameter bytes per second whatever the model's dtype (its casts run on the GPU); 0 = bytes_per_s (or
// its default) / kTorchCpuAdamSlowdown (core/model/analytic.hpp).
struct CpuAdam {
  double bytes_per_s = 0;
  double per_layer_s = 0;
  double bf16_bytes_per_s = 0;
  double fp16_bytes_per_s = 0;
  double torch_bytes_per_s = 0;
};

// Measured rates of the ways data crosses between host memory and a GPU, and of the host-only passes of the bf16
// staging (docs/machines.md, `host_paths`; written by `harmony-run probe`). Each is one transfer alone, in bytes
// per second of the bytes the transfer carries (bf16 bytes for the bf16 paths); 0 = not given, and the link rates
// and host_memcpy price the path as before.
struct HostPaths {
  double pinned_h2d_bytes_per_s = 0;         // from pinned host memory (cudaHostAlloc) to a GPU
  double pinned_d2h_bytes_per_s = 0;         // from a GPU to pinned host memory
  double pageable_h2d_bytes_per_s = 0;       // from pageable (malloc'd) host memory to a GPU
  double pageable_d2h_bytes_per_s = 0;       // from a GPU to pageable host memory
  double bf16_stage_up_bytes_per_s = 0;      // harmony-run's stage_up end to end: round to bf16 + pinned copy up
  double bf16_stage_down_bytes_per_s = 0;    // stage_down end to end: pinned copy down + widen to fp32
  double bf16_round_bytes_per_s = 0;         // host only: fp32 -> bf16 rounding, threaded as stage_up does it
  double bf16_widen_bytes_per_s = 0;         // host only: bf16 -> fp32 widening, threaded as stage_down does it
  double memcpy_one_thread_bytes_per_s = 0;  // one host memcpy on one thread (a CPU message)
  bool any() const {
    return pinned_h2d_bytes_per_s > 0 || pinned_d2h_bytes_per_s > 0 || pageable_h2d_bytes_per_s > 0 ||
           pageable_d2h_bytes_per_s > 0 || bf16_stage_up_bytes_per_s > 0 || bf16_stage_down_bytes_per_s > 0 ||
           bf16_round_bytes_per_s > 0 || bf16_widen_bytes_per_s > 0 || memcpy_one_thread_bytes_per_s > 0;
  }
};

// Compute the devices share (docs/machines.md, `compute`): the native engine runs every FWD/REC/BWD as work of
// units_per_op units x its (scaled) profiled time on one pool of `units` shared by all devices, divided by
// processor sharing. units = 0 (the default): every device computes alone at its profiled speed (a GPU each).
// N logical devices on C cores: units = C, units_per_op = threads per kernel; several logical devices on one
// GPU: units = 1, units_per_op = 1. host_cores: the units are the host's cores, which the devices' copy and
// optimizer threads and every op's dispatch also run on (the CPU device: docs/machines.md, `compute.host_cores`).
struct ComputeSharing {
  double units = 0;              // 0: not shared
  double units_per_op = 1;       // the most units one compute op can use (<= units)
  double time_scale = 1;         // multiplies every profiled FWD/REC/BWD time
  double update_time_scale = 1;  // multiplies every profiled CPU update time (the optimizer's rate)
  bool host_cores = false;       // copies (one unit each), updates (every unit) and dispatch share the pool too
  // host_cores only: how long after an op becomes ready its stream thread starts it (the executor's hand-off and the
  // thread's wake-up, a wait on a core's availability, not work on one), which fluid processor sharing does not
  // have. `harmony-sim calibrate` measures it from the fit runs' traces; 0: none.
  double wake_s = 0;
  bool shared() const { return units > 0; }
};

// A fixed dispatch cost per op, by class (docs/machines.md, `dispatch`), paid by the native engine before the
// op's work (a transfer holds its copy engine meanwhile): compute = FWD/REC/BWD; copy = swaps and CPU messages;
// p2p = device-to-device copies and collectives; update = the CPU optimizer step. 0 by default.
struct DispatchOverheads {
  double compute_s = 0;
  double copy_s = 0;
  double p2p_s = 0;
  double update_s = 0;
};

struct MachineSpec {
  std::string name;                    // preset or file name, for reports
  std::string gpu_name;                // "GTX 1080 Ti"
  int gpus = 1;                        // GPUs present in the box (a plan may use fewer)
  Bytes gpu_memory_bytes = 10 * kGiB;  // the per-GPU capacity the search packs against
  double memory_cap_scale = 1.0;       // multiplies gpu_memory_bytes in the search (paper's flag)
  // The per-GPU capacity the search packs against: gpu_memory_bytes x memory_cap_scale, rounded down (the
  // paper's --memory_cap x --memory_cap_scale). The native model's memory check uses gpu_memory_bytes itself.
  Bytes search_capacity_bytes() const {
    return static_cast<Bytes>(static_cast<double>(gpu_memory_bytes) * memory_cap_scale);
  }
  double bw_swap_bytes_per_s = 11.5 * static_cast<double>(kGiB);  // host<->GPU, per direction, shared
  double bw_p2p_bytes_per_s = 8.2 * static_cast<double>(kGiB);    // GPU<->GPU, per direction
  double bw_msg_bytes_per_s = 16.0 * static_cast<double>(kGiB);   // CPU<->CPU message
  double time_del_s = 0.040;                                      // freeing one task's tensors
  double price_per_hour = 0;                                      // optional, for cost estimates
  GpuRates gpu_rates;                                             // optional: compute rates for analytic models
  CpuAdam cpu_adam;            // optional: the CPU optimizer's throughput for analytic models
  HostPaths host_paths;        // optional: measured host<->GPU paths and bf16 staging (native model: transfer caps)
  Topology topology;           // the native model's view; empty for reference-only machines
  ComputeSharing compute;      // native model only: shared compute and the profile's time scales
  DispatchOverheads dispatch;  // native model only: per-op fixed costs
};

// One line for listings (`harmony-sim presets`): "8 x H100 80GB SXM5, 74.00 GiB per GPU, swap 46.01 GiB/s,
// p2p 335.28 GiB/s, 98.32 per hour" (the price in the machine file's currency; "no price" when it has none).
std::string machine_summary(const MachineSpec& m);

}  // namespace harmony::core

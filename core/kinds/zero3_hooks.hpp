// DeepSpeed stage 3's host-side hook work around a layer's forward and backward (plan.zero3's module and tensor
// latencies), shared by the kinds that run stage 3: zero-infinity, zero3-opt-offload and zero3. The native cost model
// puts it on the compute stream before the op (ProgramBuilder::set_overhead); the reference ignores it.
#pragma once

#include <cmath>

#include <fmt/format.h>

#include "core/base/error.hpp"
#include "core/model/model.hpp"
#include "core/plan/knobs.hpp"

namespace harmony::core::detail {

// Seconds of stage-3 hook work before a FWD (backward: a BWD) of `layer`. DeepSpeed registers its fetch and release
// hooks on every submodule (deepspeed/runtime/zero/parameter_offload.py, _register_deepspeed_module recurses over
// module.children()), so module_latency is paid once per module whose parameters it fetches and releases
// (Layer::gathered_modules: the hooks of modules without such parameters, norms and containers, are not priced), and
// tensor_latency once per parameter tensor of the layer (the fetch and release loops visit every one). In the backward
// every parameter tensor's gradient also takes its own path (stage3.py reduce_partition_and_remove_grads, the bucket
// copy, partition_grads): with the optimizer offloaded that is grad_tensor_latency (it includes the blocking copy to
// the host); without it, the hook, the bucket copy and the partition's copy or add, about the framework calls
// tensor_latency stands for.
inline double zero3_hook_seconds(const Zero3Overheads& z, const Layer& layer, bool backward, bool optimizer_offloaded) {
  double per_tensor_s = z.tensor_latency_s;
  if (backward) per_tensor_s += optimizer_offloaded ? z.grad_tensor_latency_s : z.tensor_latency_s;
  return z.module_latency_s * layer.gathered_modules_or_default() + per_tensor_s * layer.param_tensors_or_default();
}

// Refuses overheads no config could give (a library caller's Plan): latencies negative or not finite, a bucket under
// one element.
inline void validate_zero3_overheads(const char* kind, const Zero3Overheads& z) {
  for (const double s : {z.module_latency_s, z.tensor_latency_s, z.grad_tensor_latency_s})
    if (!(s >= 0) || !std::isfinite(s))
      throw ScheduleError(
          fmt::format("{}: zero3 latencies (module {} s, tensor {} s, gradient tensor {} s) must be "
                      "finite and >= 0",
                      kind, z.module_latency_s, z.tensor_latency_s, z.grad_tensor_latency_s));
  if (!(z.bucket_elements >= 1) || !std::isfinite(z.bucket_elements))
    throw ScheduleError(fmt::format("{}: zero3 bucket ({} elements) must be >= 1", kind, z.bucket_elements));
}

}  // namespace harmony::core::detail

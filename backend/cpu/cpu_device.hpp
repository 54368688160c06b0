// The CPU device: a Device whose memory is a capped Arena (--gpu-memory), whose streams are host threads
// draining FIFO queues, and whose kernels are the fp32 reference loops of backend/cpu/kernels.hpp; plus a
// Communicator over CPU devices (send/recv and an all-reduce in fixed rank order), and the registry's factory.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/arena.hpp"
#include "backend/device.hpp"

namespace harmony::backend {
class DeviceFactory;  // backend/registry.hpp
}  // namespace harmony::backend

namespace harmony::backend::cpu {

struct CpuDeviceOptions {
  Bytes capacity = 64 * core::kMiB;  // device memory; allocations beyond it throw OutOfMemory
  bool poison = kPoisonByDefault;    // fill fresh and freed memory with 0xFF (NaN as float)
  // Testing only: each stream sleeps a random 0..jitter_us microseconds before every piece of work it runs (the
  // draws seeded by jitter_seed and the stream's creation order), so work of different streams interleaves in
  // ways a missing cross-stream dependency shows up under. 0: no delays.
  int jitter_us = 0;
  std::uint64_t jitter_seed = 0;
};

std::unique_ptr<Device> make_cpu_device(int index, const CpuDeviceOptions& options = {});

// All devices must be CPU devices; rank r is devices[r].
std::unique_ptr<Communicator> make_cpu_communicator(const std::vector<Device*>& devices);

// The registry's factory of the "cpu" kind (backend/registry.cpp): make_cpu_device and make_cpu_communicator over
// DeviceOptions (capacity 0: CpuDeviceOptions' default; poison Default: kPoisonByDefault).
const DeviceFactory& device_factory();

}  // namespace harmony::backend::cpu

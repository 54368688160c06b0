// Tests of the device registry (backend/registry.hpp): the kinds and their capabilities, the located errors
// harmony-run reports for an unknown or unavailable `device:`, options checked against capabilities, and a module
// kind whose module is missing or not a module (availability with the reason, the loader's messages). The devices'
// behaviour is the conformance suite's (test_device_conformance*.cpp).
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "backend/device_module.hpp"
#include "backend/registry.hpp"

using namespace harmony::backend;
using harmony::core::ConfigError;
using harmony::core::kMiB;
using harmony::core::SourceLoc;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A kind whose factory is a module found as a module kind's is: $HARMONY_TEST_DEVICE_MODULE, else beside the
// executable, else an install folder that does not exist.
const DeviceFactory* load_test_module(DeviceAvailability& why) {
  return load_device_module({.file = "libharmony-test.so",
                             .env = "HARMONY_TEST_DEVICE_MODULE",
                             .installed = "/nonexistent/lib/harmony/libharmony-test.so",
                             .what = "the test device module",
                             .libraries = "the test libraries",
                             .fallback = "use `device: cpu`"},
                            why);
}

}  // namespace

TEST_CASE("the registry lists cpu (always available) and cuda, each with its capabilities") {
  CHECK(device_kind_names() == std::vector<std::string>{"cpu", "cuda"});
  const DeviceKind* cpu = find_device_kind("cpu");
  const DeviceKind* cuda = find_device_kind("cuda");
  REQUIRE(cpu != nullptr);
  REQUIRE(cuda != nullptr);
  CHECK(find_device_kind("tpu") == nullptr);
  CHECK(cpu->availability().available);
  CHECK(cpu->caps().bf16_kernels);
  CHECK(cpu->caps().memory_in_host);
  CHECK_FALSE(cpu->caps().tf32);
  CHECK(cuda->caps().tf32);
  CHECK(cuda->caps().tree_sums);
  CHECK(cuda->caps().fused);
  CHECK_FALSE(cpu->caps().fused);
  CHECK(cuda->caps().pinned_host_memory);
  CHECK(cuda->caps().concurrent_executor);
  CHECK(device_kinds_with(&DeviceCaps::tf32) == std::vector<std::string>{"cuda"});
  CHECK(device_kinds_with(&DeviceCaps::collectives) == std::vector<std::string>{"cpu", "cuda"});
  // cuda's availability here: available, or a reason (not built in, the module not found or not loadable, no GPU).
  const DeviceAvailability a = cuda->availability();
  MESSAGE("cuda: " << (a.available ? "available" : a.reason));
  CHECK(a.available == a.reason.empty());
  if (!a.available) {
    CHECK_FALSE(a.hint.empty());
    CHECK_THROWS_WITH_AS(cuda->make_device(0, {.capacity = kMiB}), doctest::Contains("device 'cuda' is not available"),
                         DeviceError);
  }
}

TEST_CASE("an unknown device is a located error naming the registered kinds; an unavailable one names its reason") {
  try {
    (void)device_kind_at("cdua", SourceLoc{"run.yaml", 3, 9});
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(e.loc().str() == "run.yaml:3:9");
    CHECK(e.message() == "unknown device 'cdua'");
    CHECK(contains(e.hint(), "did you mean"));
    CHECK(contains(e.hint(), "cpu ("));
    CHECK(contains(e.hint(), "cuda ("));
  }
  CHECK(&device_kind_at("cpu", SourceLoc{"run.yaml", 3, 9}) == find_device_kind("cpu"));
  CHECK_NOTHROW(require_available(*find_device_kind("cpu"), SourceLoc{"run.yaml", 3, 9}));
  const DeviceKind& cuda = *find_device_kind("cuda");
  if (!cuda.availability().available) {
    try {
      require_available(cuda, SourceLoc{"--set device=cuda", 0, 0});
      FAIL("expected a ConfigError");
    } catch (const ConfigError& e) {
      CHECK(e.loc().str() == "--set device=cuda");
      CHECK(contains(e.message(), "device 'cuda' is not available: "));
      CHECK(contains(e.hint(), "device: cpu"));
    }
  }
}

TEST_CASE("options a kind lacks are refused by name; the cpu factory takes capacity and poisoning") {
  const DeviceKind& cpu = *find_device_kind("cpu");
  CHECK_THROWS_WITH_AS(cpu.make_device(0, {.capacity = kMiB, .tf32 = true}),
                       "device 'cpu' has no tf32 option (devices with it: cuda)", DeviceError);
  CHECK_THROWS_WITH_AS(cpu.make_device(0, {.capacity = kMiB, .tree_sums = true}),
                       "device 'cpu' has no tree_sums option (devices with it: cuda)", DeviceError);
  CHECK_THROWS_WITH_AS(cpu.make_device(0, {.capacity = kMiB, .fused = true}),
                       "device 'cpu' has no fused option (devices with it: cuda)", DeviceError);
  auto d = cpu.make_device(2, {.capacity = 3 * kMiB, .poison = DeviceOptions::Poison::On});
  CHECK(d->name() == "cpu:2");
  CHECK(d->memory().capacity == 3 * kMiB);
  Buffer b = d->alloc(4);
  CHECK(*b.as<std::uint32_t>() == 0xFFFFFFFFu);  // poisoned
  auto off = cpu.make_device(0, {.capacity = kMiB, .poison = DeviceOptions::Poison::Off});
  Buffer z = off->alloc(4);
  CHECK(off->memory().in_use == 256);
  CHECK(cpu.make_device(0)->memory().capacity == 64 * kMiB);  // capacity 0: the kind's default
}

TEST_CASE("a module kind: a missing module, a file that is no module, each named with the loader's reason") {
  const DeviceKind missing("test", "a device module that is not there", {}, &load_test_module);
  ::setenv("HARMONY_TEST_DEVICE_MODULE", "/nonexistent/missing.so", 1);
  const DeviceAvailability a = missing.availability();
  CHECK_FALSE(a.available);
  CHECK(a.reason ==
        "the test device module /nonexistent/missing.so cannot be loaded: /nonexistent/missing.so: cannot "
        "open shared object file: No such file or directory");
  CHECK(contains(a.hint, "the test libraries it links must be on the library path"));
  CHECK(contains(a.hint, "use `device: cpu`"));
  CHECK_THROWS_WITH_AS(missing.make_device(0), doctest::Contains("device 'test' is not available"), DeviceError);
  // A file that dlopen() loads but that has no entry (another build's module would have another entry or table):
  // libc, which every process has loaded.
  const DeviceKind other("test2", "not a module", {}, &load_test_module);
  ::setenv("HARMONY_TEST_DEVICE_MODULE", "libc.so.6", 1);
  const DeviceAvailability b = other.availability();
  CHECK_FALSE(b.available);
  CHECK(b.reason == "libc.so.6 is not the test device module of this build (another build or version)");
  CHECK(contains(b.hint, "HARMONY_TEST_DEVICE_MODULE"));
  // Without the environment: beside the executable, then the install folder; neither there.
  ::unsetenv("HARMONY_TEST_DEVICE_MODULE");
  const DeviceKind absent("test3", "not installed", {}, &load_test_module);
  const DeviceAvailability c = absent.availability();
  CHECK_FALSE(c.available);
  CHECK(contains(c.reason, "the test device module libharmony-test.so is not installed (looked for "));
  CHECK(contains(c.reason, "/nonexistent/lib/harmony/libharmony-test.so"));
  CHECK(contains(c.hint, "meson install"));
}

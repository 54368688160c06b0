// Per-layer cost lookups of a Model, with the paper's linear interpolation between measured sizes.
// The interpolation follows numpy.interp term for term so that sums match the reference bit for bit.
#include "core/model/model.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/base/error.hpp"

namespace harmony::core {
namespace {

const std::vector<int>& sizes_of(const Model& m, Phase p) { return p == Phase::Fwd ? m.ubatch_fwd : m.ubatch_bwd; }
const char* phase_name(Phase p) { return p == Phase::Fwd ? "forward" : "backward"; }

// Index j such that xs[j] <= u <= xs[j+1] (or u == xs[j]); assumes u is in range.
std::size_t bracket(const std::vector<int>& xs, int u) {
  auto it = std::upper_bound(xs.begin(), xs.end(), u);
  return static_cast<std::size_t>(it - xs.begin()) - 1;
}

// numpy.interp for one point inside [xs.front(), xs.back()]: exact at knots,
// slope * (x - x_j) + y_j in between.
template <typename Y>
double interp(const std::vector<int>& xs, const std::vector<Y>& ys, int u) {
  std::size_t j = bracket(xs, u);
  if (xs[j] == u || j + 1 >= xs.size()) return static_cast<double>(ys[j]);
  const double slope = (static_cast<double>(ys[j + 1]) - static_cast<double>(ys[j])) /
                       (static_cast<double>(xs[j + 1]) - static_cast<double>(xs[j]));
  return slope * (static_cast<double>(u) - static_cast<double>(xs[j])) + static_cast<double>(ys[j]);
}

}  // namespace

int Model::ubatch_min(Phase p) const { return sizes_of(*this, p).front(); }
int Model::ubatch_max(Phase p) const { return sizes_of(*this, p).back(); }
bool Model::ubatch_in_range(Phase p, int u) const {
  const auto& xs = sizes_of(*this, p);
  return !xs.empty() && u >= xs.front() && u <= xs.back();
}

static void check_range(const Model& m, Phase p, int u) {
  if (!m.ubatch_in_range(p, u)) {
    throw ScheduleError(
        fmt::format("{} microbatch size {} is outside the profiled range {}..{} of {} ({}); "
                    "the profile cannot be extrapolated: pick a size in range",
                    phase_name(p), u, m.ubatch_min(p), m.ubatch_max(p), m.name, m.source));
  }
}

double Model::time_s(Phase p, int u, int layer) const {
  check_range(*this, p, u);
  const Layer& l = layers[static_cast<std::size_t>(layer)];
  return interp(sizes_of(*this, p), p == Phase::Fwd ? l.fwd_time_s : l.bwd_time_s, u);
}

Bytes Model::peak_bytes(Phase p, int u, int layer) const {
  check_range(*this, p, u);
  const Layer& l = layers[static_cast<std::size_t>(layer)];
  // int(np.interp(...)): truncation toward zero
  return static_cast<Bytes>(interp(sizes_of(*this, p), p == Phase::Fwd ? l.fwd_peak_bytes : l.bwd_peak_bytes, u));
}

Bytes Model::bwd_transient_bytes(int u, int layer) const {
  const Layer& l = layers[static_cast<std::size_t>(layer)];
  if (l.bwd_transient_bytes.empty()) return 0;
  check_range(*this, Phase::Bwd, u);
  const auto t = static_cast<Bytes>(interp(sizes_of(*this, Phase::Bwd), l.bwd_transient_bytes, u));
  return std::min(t, peak_bytes(Phase::Bwd, u, layer));
}

Bytes Model::recorded_saved_bytes(int u, int layer) const {
  const Layer& l = layers[static_cast<std::size_t>(layer)];
  if (l.saved_bytes.empty()) return -1;
  check_range(*this, Phase::Bwd, u);
  return static_cast<Bytes>(interp(sizes_of(*this, Phase::Bwd), l.saved_bytes, u));
}

Bytes Model::peak_beyond_own_bytes(int u, int layer) const {
  const Bytes own = weight_bytes(layer, layer) + buffer_bytes(layer, layer) + input_bytes(u, layer);
  return std::max(peak_bytes(Phase::Fwd, u, layer), peak_bytes(Phase::Bwd, u, layer)) - own;
}

Bytes Model::input_bytes(int u, int layer) const {
  if (layer >= num_layers()) return 0;
  return static_cast<Bytes>(u) * layers[static_cast<std::size_t>(layer)].input_bytes_per_sample;
}

Bytes Model::weight_bytes(int first, int last) const {
  Bytes s = 0;
  for (int l = first; l <= last; ++l) s += layers[static_cast<std::size_t>(l)].weight_bytes;
  return s;
}
Bytes Model::buffer_bytes(int first, int last) const {
  Bytes s = 0;
  for (int l = first; l <= last; ++l) s += layers[static_cast<std::size_t>(l)].buffer_bytes;
  return s;
}
Bytes Model::optimizer_state_bytes(int first, int last) const {
  Bytes s = 0;
  for (int l = first; l <= last; ++l) s += layers[static_cast<std::size_t>(l)].optimizer_state_bytes;
  return s;
}

Bytes Model::master_bytes(int first, int last) const {
  Bytes s = 0;
  for (int l = first; l <= last; ++l) {
    const Layer& L = layers[static_cast<std::size_t>(l)];
    if (narrow_weights(l)) continue;  // in the optimizer state
    s += L.param_count > 0 ? optimizer_param_bytes(l) : L.weight_bytes + L.buffer_bytes;
  }
  return s;
}
Bytes Model::optimizer_param_bytes(int l) const {
  const Layer& L = layers[static_cast<std::size_t>(l)];
  if (L.param_count <= 0) return L.weight_bytes;
  return (fp32_optimizer ? 4 : 2) * L.param_count;
}
bool Model::narrow_weights(int l) const {
  const Layer& L = layers[static_cast<std::size_t>(l)];
  return fp32_optimizer && L.param_count > 0 && L.weight_bytes < 3 * L.param_count;
}

void Model::validate() const {
  if (layers.size() < 1) throw ScheduleError(fmt::format("model {} has no layers", name));
  for (Phase p : {Phase::Fwd, Phase::Bwd}) {
    const auto& xs = sizes_of(*this, p);
    if (xs.empty()) throw ScheduleError(fmt::format("model {}: no {} microbatch sizes", name, phase_name(p)));
    for (std::size_t i = 0; i < xs.size(); ++i) {
      if (xs[i] < 1)
        throw ScheduleError(fmt::format("model {}: {} microbatch size {} is not positive", name, phase_name(p), xs[i]));
      if (i > 0 && xs[i] <= xs[i - 1])
        throw ScheduleError(
            fmt::format("model {}: {} microbatch sizes are not strictly ascending", name, phase_name(p)));
    }
  }
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const Layer& l = layers[i];
    const bool last = i + 1 == layers.size();
    if (l.is_criterion != last)
      throw ScheduleError(
          fmt::format("model {}: layer {} ({}) {} the criterion; the loss must be the last layer and only it", name, i,
                      l.name, l.is_criterion ? "is" : "is not"));
    if (l.fwd_time_s.size() != ubatch_fwd.size() || l.fwd_peak_bytes.size() != ubatch_fwd.size() ||
        l.bwd_time_s.size() != ubatch_bwd.size() || l.bwd_peak_bytes.size() != ubatch_bwd.size() ||
        (!l.bwd_transient_bytes.empty() && l.bwd_transient_bytes.size() != ubatch_bwd.size()) ||
        (!l.saved_bytes.empty() && l.saved_bytes.size() != ubatch_bwd.size()))
      throw ScheduleError(
          fmt::format("model {}: layer {} has per-size arrays not aligned with the microbatch sizes", name, i));
    if (l.weight_bytes < 0 || l.buffer_bytes < 0 || l.optimizer_state_bytes < 0 || l.input_bytes_per_sample < 0)
      throw ScheduleError(fmt::format("model {}: layer {} has a negative size", name, i));
  }
}

}  // namespace harmony::core

// The analytic models' memory walk (analytic_memory.hpp): each tensor's size and lifetime over one layer's graph,
// forward (with or without grad) and backward, as PyTorch's eager autograd frees them.
#include "core/model/analytic_memory.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace harmony::core::analytic_detail {
namespace {

// The memory walk over one layer's graph at microbatch u (activations and gradients; weights and buffers excluded):
// each tensor's size and lifetime, what is alive, and the bytes alive now (cur). One forward serves the no-grad
// forward and the forward with grad (which keeps the saved tensors for the backward).
struct MemoryWalk {
  const Graph& g;
  std::size_t n;
  std::vector<double> size;
  std::vector<int> last_use, saved_until;
  std::vector<char> alive, keep, is_output;
  double cur = 0;
  // backward: gradient buffers with reference counts (pass-through ops share one buffer)
  std::vector<int> grad_buf;
  std::vector<double> buf_size;
  std::vector<int> buf_refs;
  double grads = 0;  // bytes of the gradient buffers alive (within cur)

  MemoryWalk(const Graph& graph, double u)
      : g(graph),
        n(graph.tensors.size()),
        size(n),
        last_use(n, -1),
        saved_until(n, -1),
        alive(n, 0),
        keep(n, 0),
        is_output(n, 0),
        grad_buf(n, -1) {
    for (std::size_t t = 0; t < n; ++t) size[t] = g.tensors[t].bytes(u);
    for (std::size_t i = 0; i < g.ops.size(); ++i) {
      for (int t : g.ops[i].inputs) last_use[static_cast<std::size_t>(t)] = static_cast<int>(i);
      for (int t : g.ops[i].saved) {
        int& s = saved_until[static_cast<std::size_t>(t)];
        if (s < 0) s = static_cast<int>(i);  // freed after the backward of the first op that saves it
      }
    }
    for (int t : g.inputs) keep[static_cast<std::size_t>(t)] = 1;
    for (int t : g.outputs) keep[static_cast<std::size_t>(t)] = is_output[static_cast<std::size_t>(t)] = 1;
    for (int t : g.inputs) {
      alive[static_cast<std::size_t>(t)] = 1;
      cur += size[static_cast<std::size_t>(t)];
    }
  }

  // the forward, ops in order; with grad the saved tensors stay for the backward; returns the peak (from the inputs
  // alone up)
  double forward(bool with_grad) {
    double peak = cur;
    for (std::size_t i = 0; i < g.ops.size(); ++i) {
      const Op& op = g.ops[i];
      const auto born = [&](int t) {
        auto& a = alive[static_cast<std::size_t>(t)];
        if (!a) cur += size[static_cast<std::size_t>(t)];
        a = 1;
      };
      if (!op.inplace) born(op.output);
      for (int t : op.extras) born(t);
      peak = std::max(peak, cur);
      const auto maybe_free = [&](int t) {
        const auto k = static_cast<std::size_t>(t);
        if (alive[k] && !keep[k] && (!with_grad || saved_until[k] < 0) && last_use[k] <= static_cast<int>(i)) {
          alive[k] = 0;
          cur -= size[k];
        }
      };
      for (int t : op.inputs) maybe_free(t);
      maybe_free(op.output);
      for (int t : op.extras) maybe_free(t);
    }
    return peak;
  }

  // Bytes alive beyond the layer's inputs and outputs (after a forward with grad: the tensors saved for the backward).
  double retained() const {
    double bytes = 0;
    for (std::size_t t = 0; t < n; ++t) {
      if (alive[t] && !keep[t]) bytes += size[t];
    }
    return bytes;
  }

  void new_buf(std::size_t t) {
    buf_size.push_back(size[t]);
    buf_refs.push_back(1);
    cur += size[t];
    grads += size[t];
    grad_buf[t] = static_cast<int>(buf_size.size()) - 1;
  }
  void release(std::size_t t) {
    const int b = grad_buf[t];
    if (b < 0) return;
    grad_buf[t] = -1;
    if (--buf_refs[static_cast<std::size_t>(b)] == 0) {
      cur -= buf_size[static_cast<std::size_t>(b)];
      grads -= buf_size[static_cast<std::size_t>(b)];
    }
  }

  // op's input gradients: a new buffer, the output's shared (pass-through), or a second one summed into the first;
  // returns the bytes live only during the op's backward (its transient gradient)
  double input_gradients(const Op& op) {
    const auto out = static_cast<std::size_t>(op.output);
    double transient = 0;
    if (op.inplace) return transient + size[out];  // dX is a new tensor; dY is dropped after
    for (const GradInput& gi : op.grads) {
      const auto in = static_cast<std::size_t>(gi.tensor);
      if (grad_buf[in] >= 0) {
        transient += size[in];  // a second gradient, summed into the first
      } else if (gi.passthrough && grad_buf[out] >= 0 && size[in] == size[out]) {
        grad_buf[in] = grad_buf[out];
        ++buf_refs[static_cast<std::size_t>(grad_buf[out])];
      } else {
        new_buf(in);
      }
    }
    return transient;
  }

  // the backward, ops in reverse, after the forward's peak: weight and input gradients in, consumed ones out
  BackwardPeak backward(double forward_peak) {
    BackwardPeak result{forward_peak, 0};
    for (int t : g.outputs) {
      if (g.tensors[static_cast<std::size_t>(t)].needs_grad && grad_buf[static_cast<std::size_t>(t)] < 0)
        new_buf(static_cast<std::size_t>(t));  // dY, given by the caller
    }
    // The layer's weight gradients are alive for the whole backward: the Program allocates them at the layer's
    // first backward and accumulates into them over the microbatches (as PyTorch does into a kept .grad), so
    // every microbatch after the first finds them all allocated, whichever op's gradient comes first.
    for (const Op& op : g.ops) cur += op.weight_grad_bytes;
    for (std::size_t i = g.ops.size(); i-- > 0;) {
      const Op& op = g.ops[i];
      const auto out = static_cast<std::size_t>(op.output);
      const double transient = input_gradients(op);
      if (cur + transient > result.peak) result = {cur + transient, grads + transient};
      if (!op.inplace && !is_output[out]) release(out);
      for (int t : op.saved) {
        const auto k = static_cast<std::size_t>(t);
        if (saved_until[k] == static_cast<int>(i) && alive[k] && !keep[k]) {
          alive[k] = 0;
          cur -= size[k];
        }
      }
    }
    return result;
  }
};

}  // namespace

BackwardPeak peak_backward(const Graph& g, double u) {
  MemoryWalk walk(g, u);
  const double peak = walk.forward(/*with_grad=*/true);
  const double saved = walk.retained();
  BackwardPeak b = walk.backward(peak);
  b.saved = saved;
  return b;
}

double peak_nograd(const Graph& g, double u) { return MemoryWalk(g, u).forward(/*with_grad=*/false); }

}  // namespace harmony::core::analytic_detail

// The analytic models' memory walk (analytic.cpp's costs): a layer graph's tensor lifetimes as PyTorch's eager
// autograd keeps them, giving the no-grad forward's peak, the backward's peak and its transient part, and the
// tensors a forward with grad saves for the backward. Nothing outside core/model includes it.
#pragma once

#include "core/model/analytic_graph.hpp"

namespace harmony::core::analytic_detail {

// The backward walk's answer: its peak and, of that peak, the activation gradients live at that moment (dY, the
// inner gradients, dX and the op's transient gradient) — the part live only while this layer's backward runs, the
// profile's bwd_transient_memory (weight gradients are not in it: the Program allocates them). 0 when the peak
// falls in the forward with grad.
struct BackwardPeak {
  double peak = 0;
  double transient = 0;
  double saved = 0;  // what the forward with grad left alive beyond the layer's inputs and outputs
};

// Peak bytes alive of a forward with grad (saved tensors kept) followed by the backward, which allocates input
// gradients (shared through pass-through ops) and weight gradients and frees what it has consumed; with the saved
// tensors the forward left.
BackwardPeak peak_backward(const Graph& g, double u);

// Peak bytes alive of a no-grad forward: every tensor freed after its last use.
double peak_nograd(const Graph& g, double u);

}  // namespace harmony::core::analytic_detail

// AdamW exactly as torch.optim.AdamW (PyTorch 1.13, single-tensor path, amsgrad and maximize off):
// decoupled weight decay on the parameter, then the moment updates, then the bias-corrected step, with
// the scalar factors computed in double and applied in float in torch's operation order.
#pragma once

#include <cstdint>

namespace harmony::backend {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  void validate() const;  // throws BackendError for values torch rejects (lr < 0, betas outside [0, 1), ...)
};

// One step over n elements. `step` is the step number after increment: 1 on a parameter's first update.
//   param *= 1 - lr*wd;  m = m*b1 + (1-b1)*g;  v = v*b2 + (1-b2)*g*g;
//   param += -(lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
void adamw_update(const AdamWConfig& config, std::int64_t step, float* param, const float* grad, float* exp_avg,
                  float* exp_avg_sq, std::int64_t n);

}  // namespace harmony::backend

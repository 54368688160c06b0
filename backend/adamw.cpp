// torch.optim.AdamW's single-tensor update, operation for operation (see adamw.hpp): the scalar
// factors in double, the element updates in float in the order torch applies them.
#include "backend/adamw.hpp"

#include <cmath>

#include <fmt/format.h>

#include "backend/device.hpp"

namespace harmony::backend {

void AdamWConfig::validate() const {
  if (!(lr >= 0)) throw BackendError(fmt::format("AdamW: invalid learning rate {}", lr));
  if (!(eps >= 0)) throw BackendError(fmt::format("AdamW: invalid eps {}", eps));
  if (!(beta1 >= 0 && beta1 < 1)) throw BackendError(fmt::format("AdamW: invalid beta1 {}", beta1));
  if (!(beta2 >= 0 && beta2 < 1)) throw BackendError(fmt::format("AdamW: invalid beta2 {}", beta2));
  if (!(weight_decay >= 0)) throw BackendError(fmt::format("AdamW: invalid weight_decay {}", weight_decay));
}

void adamw_update(const AdamWConfig& c, std::int64_t step, float* param, const float* grad, float* exp_avg,
                  float* exp_avg_sq, std::int64_t n) {
  if (step < 1) throw BackendError(fmt::format("AdamW: step {} must be >= 1", step));
  const double bias_correction1 = 1.0 - std::pow(c.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(c.beta2, static_cast<double>(step));
  const auto decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
  const auto b1 = static_cast<float>(c.beta1);
  const auto one_minus_b1 = static_cast<float>(1.0 - c.beta1);
  const auto b2 = static_cast<float>(c.beta2);
  const auto one_minus_b2 = static_cast<float>(1.0 - c.beta2);
  const auto bc2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const auto eps = static_cast<float>(c.eps);
  const auto neg_step_size = static_cast<float>(-(c.lr / bias_correction1));
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    float p = param[i] * decay;                                 // param.mul_(1 - lr * weight_decay)
    const float m = exp_avg[i] * b1 + one_minus_b1 * g;         // exp_avg.mul_(beta1).add_(grad, alpha=1-beta1)
    const float v = exp_avg_sq[i] * b2 + one_minus_b2 * g * g;  // exp_avg_sq.mul_(beta2).addcmul_(g, g, 1-beta2)
    const float denom = std::sqrt(v) / bc2_sqrt + eps;          // (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
    p = p + neg_step_size * m / denom;                          // param.addcdiv_(exp_avg, denom, -step_size)
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

}  // namespace harmony::backend

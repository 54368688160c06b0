// Loading a config as another plan kind: a sweep point of a baseline kind (dp-swap, pp-swap, zero-infinity, l2l,
// lohan) is a harmony-pp config (plan.mode names only Harmony modes) whose plan is checked under that kind's own
// plan rules (core/plan/plan_rules), not harmony-pp's.
#pragma once

#include <string>
#include <vector>

#include "core/config/config.hpp"
#include "core/plan/plan_kind.hpp"

namespace harmony::core {

// load_config_text, with plan.gpus, plan.minibatch and the microbatch keys checked under `kind`'s plan rules. A
// baseline kind reads one microbatch size (plan.u_bwd, search.u_bwd; u_fwd is not checked) with equal microbatches.
RunConfig load_config_text_as(PlanKind kind, const std::string& text, const std::string& name,
                              const std::vector<std::string>& overrides = {});

}  // namespace harmony::core

// The plan-kind registry (plan_kind.hpp): the kinds core/kinds/ registers at static initialization, read in listing
// order. Registration is refused once the registry has been read, so a kind can never be missing from one listing
// and present in another.
#include "core/plan/plan_kind.hpp"

#include <algorithm>
#include <mutex>

#include <fmt/format.h>

#include "core/base/error.hpp"

namespace harmony::core {

namespace {

struct Registry {
  std::mutex mutex;
  std::vector<const PlanKindSpec*> specs;  // in registration order
  bool read = false;
};

Registry& registry() {
  static Registry r;
  return r;
}

const std::vector<PlanKind>& sorted_kinds() {
  static const std::vector<PlanKind> kinds = [] {
    Registry& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    r.read = true;
    std::vector<const PlanKindSpec*> specs = r.specs;
    std::stable_sort(specs.begin(), specs.end(),
                     [](const PlanKindSpec* a, const PlanKindSpec* b) { return a->listing_order < b->listing_order; });
    std::vector<PlanKind> out;
    out.reserve(specs.size());
    for (const PlanKindSpec* s : specs) out.emplace_back(*s);
    if (out.empty()) throw InternalError("no plan kind is registered (core/kinds/ not linked whole)");
    return out;
  }();
  return kinds;
}

}  // namespace

const char* kind_role_name(KindRole r) {
  switch (r) {
    case KindRole::Harmony:
      return "harmony";
    case KindRole::Baseline:
      return "baseline";
    case KindRole::Ceiling:
      return "ceiling";
  }
  return "?";
}

PlanKind::PlanKind() : PlanKind(plan_kinds().front()) {}

bool PlanKind::has_knob(Knob k) const {
  return std::find(spec_->knobs.begin(), spec_->knobs.end(), k) != spec_->knobs.end();
}

bool register_plan_kind(const PlanKindSpec& spec) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const std::string name = spec.name;
  if (r.read) throw InternalError(fmt::format("plan kind '{}' registered after the registry was read", name));
  if (name.empty()) throw InternalError("a plan kind without a name");
  if (!spec.validate || !spec.lower || !spec.enumerate || !spec.describe)
    throw InternalError(fmt::format("plan kind '{}' lacks a function (validate, lower, enumerate, describe)", name));
  std::vector<std::string> spellings = spec.aliases;
  spellings.push_back(name);
  for (const PlanKindSpec* other : r.specs) {
    if (other->listing_order == spec.listing_order)
      throw InternalError(
          fmt::format("plan kinds '{}' and '{}' share listing_order {}", other->name, name, spec.listing_order));
    for (const std::string& s : spellings)
      if (s == other->name || std::find(other->aliases.begin(), other->aliases.end(), s) != other->aliases.end())
        throw InternalError(fmt::format("plan kind '{}': '{}' is already plan kind '{}'", name, s, other->name));
  }
  r.specs.push_back(&spec);
  return true;
}

const std::vector<PlanKind>& plan_kinds() { return sorted_kinds(); }

const std::vector<std::string>& plan_kind_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const PlanKind& k : plan_kinds()) v.emplace_back(k.name());
    return v;
  }();
  return names;
}

std::optional<PlanKind> find_plan_kind(std::string_view name, bool with_aliases) {
  for (const PlanKind& k : plan_kinds()) {
    if (name == k.name()) return k;
    if (with_aliases && std::find(k->aliases.begin(), k->aliases.end(), name) != k->aliases.end()) return k;
  }
  return std::nullopt;
}

PlanKind plan_kind(std::string_view name) {
  if (auto k = find_plan_kind(name)) return *k;
  throw InternalError(fmt::format("no plan kind '{}' is registered", name));
}

const char* plan_kind_name(PlanKind k) { return k.name(); }

int kind_column_width() {
  // the registry is complete before main: computed once, on the first table row
  static const int width = [] {
    std::size_t w = 14;
    for (const std::string& name : plan_kind_names()) w = std::max(w, name.size());
    return static_cast<int>(w);
  }();
  return width;
}

std::vector<std::string> plan_kind_names(KindRole role) {
  std::vector<std::string> v;
  for (const PlanKind& k : plan_kinds())
    if (k->role == role) v.emplace_back(k.name());
  return v;
}

std::vector<std::string> plan_kind_names(Knob knob) {
  std::vector<std::string> v;
  for (const PlanKind& k : plan_kinds())
    if (k.has_knob(knob)) v.emplace_back(k.name());
  return v;
}

}  // namespace harmony::core

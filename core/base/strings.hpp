// Small text helpers for the core's messages, in base so that every room can use them (today the plan rules'
// errors): a list of numbers as one line of text. Nothing here prints.
#pragma once

#include <string>
#include <vector>

namespace harmony::core {

// "1, 2, 3": the numbers in order, separated by ", "; "" for an empty list.
std::string join_ints(const std::vector<int>& items);

}  // namespace harmony::core

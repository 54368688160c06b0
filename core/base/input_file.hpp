// The one gate every input reader (configs, machine files, profiles, token files, weights, checkpoints) passes:
// open a path for reading without blocking on a FIFO, and refuse anything but a readable regular file with the
// OS's reason ("Is a directory", "Permission denied", "not a regular file (a FIFO)").
#pragma once

#include <optional>
#include <string>

namespace harmony::core {

// What a node that is not a regular file or folder is, from its st_mode: "a FIFO", "a character device",
// "a block device", "a socket" ("not a file" otherwise); the words of every "not a regular file (...)" message.
const char* special_file_kind(unsigned mode);

// Opens PATH read-only (O_CLOEXEC; never blocks on a FIFO) and returns the descriptor, in blocking mode, of a
// regular file; the caller closes it. On failure returns -1 and sets *problem to the reason: strerror(errno)
// ("No such file or directory", "Permission denied", "Is a directory") or "not a regular file (a FIFO)"
// (a character device, a block device, a socket).
int open_input_file(const std::string& path, std::string* problem);

// The reason PATH cannot be read as an input (open_input_file's), or nullopt when it can.
std::optional<std::string> input_file_problem(const std::string& path);

// The whole of PATH (through open_input_file), or nullopt with *problem set to the reason.
std::optional<std::string> try_read_input_file(const std::string& path, std::string* problem);

// The whole of PATH (through open_input_file). FileError "cannot read WHAT: REASON" naming the path, with `hint`.
std::string read_input_file(const std::string& path, const std::string& what, const std::string& hint = {});

}  // namespace harmony::core

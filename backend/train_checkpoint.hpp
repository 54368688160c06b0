// Training checkpoints for harmony-run's --checkpoint-dir / --resume: one file per saved step
// (DIR/step-000120.hckpt) holding the run's meta (model, batch, data fingerprint, AdamW, step, data position,
// RNG state, loss history), the host master weights and AdamW moments as raw float bits, per-layer step counts
// and an xxHash64 checksum. Written atomically (temp file, fsync, rename, directory fsync), verified whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/adamw.hpp"
#include "backend/bf16.hpp"
#include "backend/device.hpp"
#include "backend/model/gpt2.hpp"
#include "backend/model/state.hpp"
#include "backend/xxhash64.hpp"  // the format's checksum (XxHash64)
#include "core/base/file_lock.hpp"

namespace harmony::backend {

// The file format, version 2 (all integers and floats little-endian):
//   byte 0   "HRMYCKPT"                         magic
//   byte 8   u32 version (2), u32 flags (0)
//   byte 16  u64 header_bytes                   JSON header length, padded with spaces to a multiple of 8
//   byte 24  u64 payload_bytes
//   byte 32  JSON header: the CheckpointMeta (the model's arch, "gpt2" or "llama", its shape and for a Llama
//            model its n_kv_head, intermediate_size, rope_theta, tie_embeddings, qkv_bias, sliding_window;
//            doubles, ln_eps and rope_theta also as hex bit patterns, which are the ones read back), the layer
//            names and float counts, the number of losses
//   payload  per layer 0..L+1: weights, exp_avg, exp_avg_sq (f32 each, param_floats(layer) of them);
//            then the per-layer AdamW step counts (i64 each); then the losses (f64 each)
//   last 8   u64 XXH64 (seed 0) of every byte before it
// The same meta and state always give the same bytes (no timestamps). Version 1 (GPT-2 only, no "arch") is read
// as a GPT-2 model; everything else in it is as in version 2.
inline constexpr std::uint32_t kCheckpointVersion = 2;
inline constexpr int kDefaultCheckpointKeep = 2;

// A checkpoint that cannot be written, read or used. what(): "<file>: <problem>\n  hint: <how to fix it>".
class CheckpointError : public BackendError {
 public:
  CheckpointError(std::string file, const std::string& problem, const std::string& hint);
  const std::string& file() const { return file_; }
  const std::string& problem() const { return problem_; }
  const std::string& hint() const { return hint_; }

 private:
  std::string file_, problem_, hint_;
};

struct CheckpointMeta {
  Gpt2Config model;  // must match on load (and the HostState's model)
  int batch = 0;     // sequences per minibatch; must match
  int seq_len = 0;   // tokens per sequence; must match
  // Human-readable plan fingerprint ("harmony-pp N4 u2/1 ..."): informational, stored and reported, never
  // compared (a resume under another schedule is legal and gives the same numbers).
  std::string plan;
  // Data source fingerprint (file name + token count + hash, or "synthetic:seed=..."); must match.
  std::string data;
  AdamWConfig adamw;  // must match, bit for bit
  // The devices' storage precision (train.dtype); must match when both sides record it: a bf16 run resumed in
  // fp32 (or the reverse) would continue with other numerics than the run that wrote it. nullopt: not recorded
  // (checkpoints written before harmony-run recorded it, which then resume under either).
  std::optional<DType> dtype = DType::F32;
  std::int64_t step = 0;            // steps completed
  std::uint64_t data_position = 0;  // where the data continues (the caller's unit: token offset or batch)
  std::uint64_t rng_seed = 0;       // RNG state
  std::uint64_t rng_counter = 0;    //
  std::vector<double> losses;       // per-step loss history so far, stored as raw bits
};

// "step-000120.hckpt": the name save_checkpoint gives step `step` (at least six digits).
std::string checkpoint_file_name(std::int64_t step);

// Writes DIR/checkpoint_file_name(meta.step) atomically and returns its path: the file is written as
// DIR/step-NNNNNN.hckpt.tmp, fsynced, renamed over the final name and the directory fsynced, so a crash leaves
// either the old or the new file. DIR is created if missing. Only then are older checkpoints deleted: of the
// checkpoints with a smaller step, the newest keep-1 stay (with the new one, `keep` in all), as do any with a
// larger step (never this call's to judge: the caller should not save into a directory holding a newer run);
// stale *.tmp files are removed too. Deleting is best effort (a failure is retried by the next save). Saving
// the step of an existing file replaces it atomically. One writer per directory. CheckpointError (with nothing
// changed in DIR but a removed temp file) when meta does not fit `state`, keep < 1, or any I/O step fails.
// Gradients are not saved.
std::string save_checkpoint(const std::string& dir, const CheckpointMeta& meta, const HostState& state,
                            int keep = kDefaultCheckpointKeep);

struct CheckpointFile {
  std::int64_t step = 0;
  std::string path;
};
// The checkpoints in DIR by name (regular files "step-<digits>.hckpt"; *.tmp and anything else ignored),
// oldest step first; contents are not read. Empty when DIR does not exist; CheckpointError when it cannot be
// listed or is not a directory.
std::vector<CheckpointFile> list_checkpoints(const std::string& dir);
// The path of the checkpoint with the largest step in DIR, or nullopt if there is none.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Reads and verifies a whole checkpoint (magic, version, lengths, checksum over every byte, header fields)
// and returns its meta, without loading any state. CheckpointError saying what is wrong and what to do:
// truncated, corrupt (checksum), not a checkpoint, a newer format version, a malformed header.
CheckpointMeta read_checkpoint_meta(const std::string& path);

// read_checkpoint_meta, then: if `expect` is given, its model, batch, seq_len, data, adamw and dtype (when both record
// one) must equal the file's (plan, step, positions, RNG and losses are not compared); a mismatch is a CheckpointError
// naming the field, the file's value and the expected one. `state` must have been built for the file's model. Only then
// is `state` filled: weights, exp_avg, exp_avg_sq and step counts from the file, gradients zeroed (on any
// error before this point `state` is untouched; an I/O error during it leaves it unspecified).
CheckpointMeta load_checkpoint(const std::string& path, HostState& state, const CheckpointMeta* expect = nullptr);

// The one writer of a checkpoint directory: an exclusive flock on DIR/harmony-run.lock (core::FileLock: the file names
// the holder's pid and host) for the life of this object, so a second run (fresh or --resume) into the directory of
// a running one is refused instead of the two overwriting each other's checkpoints. DIR is created when missing.
// CheckpointError naming the holder when another process holds it, or when the directory or lock cannot be made.
inline constexpr const char* kCheckpointLockFile = "harmony-run.lock";
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::string& dir);

 private:
  core::FileLock lock_;
};

}  // namespace harmony::backend

// Training checkpoint files (see train_checkpoint.hpp), the store: names (step-NNNNNN.hckpt), listing a
// directory, saving through core::AtomicFile (temp file, fsync, rename, directory fsync; then pruning the older
// ones), reading the meta and loading into a HostState. The byte format is train_checkpoint_format.cpp's.
#include "backend/train_checkpoint.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "backend/train_checkpoint_internal.hpp"
#include "core/base/atomic_file.hpp"

namespace harmony::backend {

static_assert(std::endian::native == std::endian::little, "checkpoint I/O assumes a little-endian host");

namespace fs = std::filesystem;
using namespace checkpoint_detail;  // NOLINT(google-build-using-namespace): the checkpoint's own internals

namespace checkpoint_detail {

// The step of a canonical checkpoint name (exactly checkpoint_file_name(step)), else nullopt.
std::optional<std::int64_t> parse_checkpoint_name(std::string_view name) {
  if (!name.starts_with(kPrefix) || !name.ends_with(kSuffix)) return std::nullopt;
  const std::string_view digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  std::int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  if (checkpoint_file_name(step) != name) return std::nullopt;  // "step-120.hckpt", "step-0000120.hckpt"
  return step;
}

std::string parent_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// What to do about a damaged file: name the previous checkpoint in its directory if there is one.
std::string damaged_hint(const std::string& path) {
  const std::string dir = parent_dir(path);
  const std::string self = fs::path(path).filename().string();
  const std::optional<std::int64_t> own_step = parse_checkpoint_name(self);
  std::optional<CheckpointFile> previous;
  try {
    for (const CheckpointFile& f : list_checkpoints(dir)) {
      if (fs::path(f.path).filename().string() == self) continue;
      if (own_step && f.step >= *own_step) continue;
      previous = f;  // ascending: the last one kept is the newest before this file
    }
  } catch (const CheckpointError&) {
    // an unlistable directory: no suggestion
  }
  if (previous)
    return fmt::format("move it away and resume from {}, the previous checkpoint in {}", previous->path, dir);
  return fmt::format("there is no older checkpoint in {}: move the file away and start the run again", dir);
}

}  // namespace checkpoint_detail

namespace {

// Deletes the checkpoints older than the newest keep-1 before `step`, and stale temp files. Best effort.
void prune(const std::string& dir, std::int64_t step, int keep) {
  std::vector<CheckpointFile> older;
  std::vector<fs::path> stale;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.ends_with(kTmpSuffix) && parse_checkpoint_name(name.substr(0, name.size() - kTmpSuffix.size()))) {
      stale.push_back(it->path());
      continue;
    }
    const std::optional<std::int64_t> s = parse_checkpoint_name(name);
    std::error_code type_ec;
    if (s && *s < step && it->is_regular_file(type_ec)) older.push_back({*s, it->path().string()});
  }
  std::sort(older.begin(), older.end(), [](const auto& a, const auto& b) { return a.step > b.step; });
  for (std::size_t i = static_cast<std::size_t>(keep - 1); i < older.size(); ++i) {
    std::error_code rm_ec;
    fs::remove(older[i].path, rm_ec);
  }
  for (const fs::path& p : stale) {
    std::error_code rm_ec;
    fs::remove(p, rm_ec);
  }
}

}  // namespace

CheckpointError::CheckpointError(std::string file, const std::string& problem, const std::string& hint)
    : BackendError(fmt::format("{}: {}{}", file, problem, hint.empty() ? "" : "\n  hint: " + hint)),
      file_(std::move(file)),
      problem_(problem),
      hint_(hint) {}

std::string checkpoint_file_name(std::int64_t step) { return fmt::format("step-{:06d}.hckpt", step); }

std::vector<CheckpointFile> list_checkpoints(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (st.type() == fs::file_type::not_found) return {};
  if (ec)
    throw CheckpointError(dir, fmt::format("cannot inspect the checkpoint directory: {}", ec.message()),
                          "check the path and its permissions");
  if (st.type() != fs::file_type::directory)
    throw CheckpointError(dir, "the checkpoint directory is not a directory",
                          "name a directory (it is created when missing)");
  std::vector<CheckpointFile> out;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::optional<std::int64_t> step = parse_checkpoint_name(it->path().filename().string());
    std::error_code type_ec;
    if (step && it->is_regular_file(type_ec)) out.push_back({*step, it->path().string()});
  }
  if (ec)
    throw CheckpointError(dir, fmt::format("cannot list the checkpoint directory: {}", ec.message()),
                          "check its permissions");
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  std::vector<CheckpointFile> files = list_checkpoints(dir);
  if (files.empty()) return std::nullopt;
  return std::move(files.back().path);
}

std::string save_checkpoint(const std::string& dir, const CheckpointMeta& meta, const HostState& state, int keep) {
  const Gpt2& model = state.model();
  std::string final_path = (fs::path(dir) / checkpoint_file_name(meta.step)).string();
  const std::string tmp_path = final_path + std::string(kTmpSuffix);
  const std::string nothing_written = "nothing was written";
  auto refuse = [&](const std::string& problem) {
    throw CheckpointError(final_path, "cannot save: " + problem, nothing_written);
  };
  if (keep < 1) refuse(fmt::format("keep is {}; at least the new checkpoint must be kept (keep >= 1)", keep));
  if (meta.step < 0) refuse(fmt::format("step {} is negative", meta.step));
  if (meta.batch < 1 || meta.seq_len < 1)
    refuse(fmt::format("batch {} and seq_len {} must be positive", meta.batch, meta.seq_len));
  if (!(meta.model == model.config()))
    refuse(
        fmt::format("the meta's model ({}) is not the state's ({})", describe(meta.model), describe(model.config())));
  try {
    meta.adamw.validate();
  } catch (const BackendError& e) {
    refuse(e.what());
  }

  std::string header;
  try {
    header = header_json(meta, model).dump();
  } catch (const nlohmann::json::exception& e) {
    refuse(fmt::format("the plan or data fingerprint is not valid UTF-8 ({})", e.what()));
  }
  header.append((8 - header.size() % 8) % 8, ' ');
  std::uint64_t payload_bytes = 0;
  for (int l = 0; l < model.num_layers(); ++l)
    payload_bytes += 3 * static_cast<std::uint64_t>(model.param_floats(l)) * sizeof(float);
  payload_bytes += static_cast<std::uint64_t>(model.num_layers()) * sizeof(std::int64_t);
  payload_bytes += meta.losses.size() * sizeof(double);

  std::error_code ec;
  fs::create_directories(dir, ec);
  std::error_code dir_ec;
  if (ec || !fs::is_directory(dir, dir_ec))
    throw CheckpointError(dir,
                          fmt::format("cannot create the checkpoint directory: {}",
                                      ec ? ec.message() : std::string("a file of that name exists")),
                          "name a writable directory");

  const std::string write_hint = fmt::format(
      "free space in {} or raise the file size limit (ulimit -f), or choose another checkpoint directory; the "
      "previous checkpoints are untouched",
      dir);
  try {
    core::AtomicFile file(final_path, "the checkpoint", write_hint);  // DIR/step-NNNNNN.hckpt.tmp, then renamed
    HashingWriter w(file);
    w.put(kMagic.data(), kMagic.size());
    w.put_value<std::uint32_t>(kCheckpointVersion);
    w.put_value<std::uint32_t>(0);  // flags
    w.put_value<std::uint64_t>(header.size());
    w.put_value<std::uint64_t>(payload_bytes);
    w.put(header.data(), header.size());
    // each block at the layer's full size: a tied twin has no moments in the HostState and stores zeros (the format
    // from before its moments were dropped)
    const std::vector<float> zeros(static_cast<std::size_t>(model.param_floats(model.head_layer())), 0.0f);
    for (int l = 0; l < model.num_layers(); ++l) {
      const std::span<const float> blocks[] = {state.weights(l), state.exp_avg(l), state.exp_avg_sq(l)};
      for (const std::span<const float> b : blocks) {
        w.put(b.data(), b.size_bytes());
        const auto tail = static_cast<std::size_t>(model.param_floats(l)) - b.size();
        w.put(zeros.data(), std::min(tail, zeros.size()) * sizeof(float));
      }
    }
    for (int l = 0; l < model.num_layers(); ++l) w.put_value<std::int64_t>(state.steps(l));
    w.put(meta.losses.data(), meta.losses.size() * sizeof(double));
    const std::uint64_t checksum = w.digest();
    w.put_value<std::uint64_t>(checksum);
    w.flush();
    file.commit();  // fsync, rename over the final name, fsync DIR; the temp file is removed on any failure
  } catch (const core::FileError& e) {
    throw CheckpointError(e.path(), e.message(), write_hint);
  }
  prune(dir, meta.step, keep);
  return final_path;
}

CheckpointDirLock::CheckpointDirLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::error_code dir_ec;
  if (ec || !fs::is_directory(dir, dir_ec))
    throw CheckpointError(dir,
                          fmt::format("cannot create the checkpoint directory: {}",
                                      ec ? ec.message() : std::string("a file of that name exists")),
                          "name a writable directory");
  const fs::path path = fs::path(dir) / kCheckpointLockFile;
  const auto failure = lock_.lock(path, core::FileLock::Mode::Exclusive);
  if (!failure) return;
  using Kind = core::FileLock::Failure::Kind;
  if (failure->kind == Kind::Busy)
    throw CheckpointError(
        dir,
        fmt::format("another harmony-run is writing checkpoints into this directory ({})",
                    failure->holder.empty() ? "holder not recorded yet" : failure->holder),
        fmt::format("wait for that run to finish, or stop it (Ctrl-C saves a checkpoint; continue it with --resume), "
                    "or give this run another --checkpoint-dir; {} names the last writer",
                    path.string()));
  throw CheckpointError(path.string(),
                        fmt::format("cannot {} the checkpoint directory's lock file: {}",
                                    failure->kind == Kind::LockFailed    ? "lock"
                                    : failure->kind == Kind::WriteFailed ? "write"
                                                                         : "create",
                                    failure->kind == Kind::WriteFailed ? core::write_error_reason(failure->error)
                                                                       : std::string(std::strerror(failure->error))),
                        failure->kind == Kind::LockFailed ? "use a checkpoint directory on a file system with locks"
                                                          : "name a writable directory");
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  Verified v = open_and_verify(path);
  std::vector<std::int64_t> steps;
  read_tail(v, path, steps, v.parsed.meta.losses);
  return std::move(v.parsed.meta);
}

CheckpointMeta load_checkpoint(const std::string& path, HostState& state, const CheckpointMeta* expect) {
  Verified v = open_and_verify(path);
  const CheckpointMeta& got = v.parsed.meta;
  if (expect != nullptr) {
    auto mismatch = [&](const std::string& field, const std::string& file_value, const std::string& expected) {
      throw CheckpointError(
          path, fmt::format("{} differs: the checkpoint has {}, this run has {}", field, file_value, expected),
          fmt::format("resume with {} = {} as the run that wrote it, or start a new run in another checkpoint "
                      "directory",
                      field, file_value));
    };
    auto check_int = [&](const char* field, auto a, auto b) {
      if (a != b) mismatch(field, fmt::format("{}", a), fmt::format("{}", b));
    };
    auto check_double = [&](const char* field, double a, double b) {
      if (std::bit_cast<std::uint64_t>(a) != std::bit_cast<std::uint64_t>(b))
        mismatch(field, fmt::format("{} (bits {})", a, bits_hex(a)), fmt::format("{} (bits {})", b, bits_hex(b)));
    };
    auto check_float = [&](const char* field, float a, float b) {
      if (std::bit_cast<std::uint32_t>(a) != std::bit_cast<std::uint32_t>(b))
        mismatch(field, fmt::format("{}", a), fmt::format("{}", b));
    };
    // The architecture first: another family differs in every field below.
    if (got.model.arch != expect->model.arch)
      mismatch("model.arch", std::string(arch_name(got.model.arch)), std::string(arch_name(expect->model.arch)));
    check_int("model.vocab_size", got.model.vocab_size, expect->model.vocab_size);
    check_int("model.max_seq_len", got.model.max_seq_len, expect->model.max_seq_len);
    check_int("model.n_layer", got.model.n_layer, expect->model.n_layer);
    check_int("model.n_head", got.model.n_head, expect->model.n_head);
    check_int("model.n_embd", got.model.n_embd, expect->model.n_embd);
    check_float("model.ln_eps", got.model.ln_eps, expect->model.ln_eps);
    // The Llama fields (a GPT-2 config holds their defaults on both sides).
    check_int("model.n_kv_head", got.model.kv_heads(), expect->model.kv_heads());  // 0 means n_head
    check_int("model.intermediate_size", got.model.intermediate_size, expect->model.intermediate_size);
    check_float("model.rope_theta", got.model.rope_theta, expect->model.rope_theta);
    check_int("model.tie_embeddings", got.model.tie_embeddings, expect->model.tie_embeddings);
    check_int("model.qkv_bias", got.model.qkv_bias, expect->model.qkv_bias);
    check_int("model.sliding_window", got.model.sliding_window, expect->model.sliding_window);
    check_int("batch", got.batch, expect->batch);
    check_int("seq_len", got.seq_len, expect->seq_len);
    if (got.data != expect->data) mismatch("data", '"' + got.data + '"', '"' + expect->data + '"');
    if (got.dtype && expect->dtype && *got.dtype != *expect->dtype)
      mismatch("train.dtype", std::string(dtype_name(*got.dtype)), std::string(dtype_name(*expect->dtype)));
    check_double("adamw.lr", got.adamw.lr, expect->adamw.lr);
    check_double("adamw.beta1", got.adamw.beta1, expect->adamw.beta1);
    check_double("adamw.beta2", got.adamw.beta2, expect->adamw.beta2);
    check_double("adamw.eps", got.adamw.eps, expect->adamw.eps);
    check_double("adamw.weight_decay", got.adamw.weight_decay, expect->adamw.weight_decay);
  }
  const Gpt2& model = state.model();
  if (!got.model.same_model(model.config()))
    throw CheckpointError(path,
                          fmt::format("the checkpoint holds the model {}, the state to load it into was built for {}",
                                      describe(got.model), describe(model.config())),
                          "build the HostState for the checkpoint's model (read_checkpoint_meta(path).model)");
  for (int l = 0; l < model.num_layers(); ++l)
    if (v.parsed.layer_floats[static_cast<std::size_t>(l)] != static_cast<std::uint64_t>(model.param_floats(l)))
      malformed(path, fmt::format("layer {} has {} floats, the model's {} has {}", l,
                                  v.parsed.layer_floats[static_cast<std::size_t>(l)], model.layer_name(l),
                                  model.param_floats(l)));

  CheckpointMeta meta = std::move(v.parsed.meta);
  std::vector<std::int64_t> steps;
  read_tail(v, path, steps, meta.losses);
  // Everything is verified: fill the state.
  std::uint64_t at = v.parsed.payload_offset;
  for (int l = 0; l < model.num_layers(); ++l) {
    const std::span<float> blocks[] = {state.weights(l), state.exp_avg(l), state.exp_avg_sq(l)};
    for (const std::span<float> b : blocks) {
      pread_exact(v.fd.get(), path, at, b.data(), b.size_bytes());
      at += static_cast<std::uint64_t>(model.param_floats(l)) * sizeof(float);  // a tied twin's moments: skipped
    }
    state.set_steps(l, steps[static_cast<std::size_t>(l)]);
  }
  state.zero_grads();
  return meta;
}

}  // namespace harmony::backend

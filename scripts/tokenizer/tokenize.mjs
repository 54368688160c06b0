#!/usr/bin/env node
// Text to an llm.c token file with GPT-2's own BPE (js-tiktoken's bundled gpt2 ranks, installed by
// scripts/install-deps.sh with `npm ci` here): the 1024-byte header (256 int32: magic 20240520, version 1,
// token count) then uint16 little-endian ids, each input a document preceded by <|endoftext|> (50256), as
// llm.c's data scripts write them. Usage: node scripts/tokenizer/tokenize.mjs IN.txt [IN2.txt ...] OUT.bin
//   --no-eot   no <|endoftext|> before each document;   --print   also print the ids (JSON) on stdout
// OUT.bin follows the C++ tools' output rules (core/base/atomic_file.hpp): checked before any work, written to
// TARGET.tmp beside its target, fsynced and renamed over it; a regular file is replaced (its permission bits kept),
// a symlink written through (the link kept, its target replaced), a folder, device, FIFO or socket refused. A
// failed write (a full disk, the file size limit) exits 2 naming the file, keeps the previous one, removes the temp.
import {
  accessSync, closeSync, constants, fchmodSync, fsyncSync, lstatSync, openSync, readFileSync, readlinkSync,
  renameSync, statSync, unlinkSync, writeSync,
} from "node:fs";
import { dirname, isAbsolute, join, normalize } from "node:path";
import { Tiktoken } from "js-tiktoken/lite";
import gpt2 from "js-tiktoken/ranks/gpt2";

const EOT = 50256;
const MAGIC = 20240520;

function fail(message, hint = "") {
  process.stderr.write(`tokenize: error: ${message}\n${hint ? `  hint: ${hint}\n` : ""}`);
  process.exit(2);
}

// What a node that is not a regular file is, as core::special_file_kind names it.
function specialKind(st) {
  if (st.isFIFO()) return "a FIFO";
  if (st.isCharacterDevice()) return "a character device";
  if (st.isBlockDevice()) return "a block device";
  if (st.isSocket()) return "a socket";
  return "not a file";
}

// The OS's reason, as strerror words it ("No such file or directory"), from a Node error ("ENOENT: no such ...").
function reason(e) {
  const words = { ENOENT: "No such file or directory", EACCES: "Permission denied", EROFS: "Read-only file system",
    EISDIR: "Is a directory", ENOTDIR: "Not a directory", ENOSPC: "No space left on device", ELOOP:
    "Too many levels of symbolic links", EPERM: "Operation not permitted", EDQUOT: "Disk quota exceeded" };
  if (e.code === "EFBIG") {
    // The limit itself (RLIMIT_FSIZE), as the C++ tools name it (core::write_error_reason).
    let limit = null;
    try {
      const m = readFileSync("/proc/self/limits", "utf8").match(/^Max file size\s+(\d+)\s/m);
      if (m) limit = Number(m[1]);
    } catch {}
    return limit === null ? "File too large"
      : `File too large (the file size limit, ulimit -f, is ${limit} bytes)`;
  }
  return words[e.code] ?? e.message;
}

// The file a write to PATH lands on: PATH, or the end of its chain of symbolic links (core::output_target).
function outputTarget(path) {
  let cur = path;
  for (let i = 0; i < 40; ++i) {
    let st;
    try {
      st = lstatSync(cur);
    } catch {
      return cur;
    }
    if (!st.isSymbolicLink()) return cur;
    let link;
    try {
      link = readlinkSync(cur);
    } catch (e) {
      fail(`${path}: cannot read the symbolic link: ${reason(e)}`, "point the link at a file");
    }
    cur = isAbsolute(link) ? link : normalize(join(dirname(cur), link));
  }
  fail(`${path}: cannot follow the symbolic link: Too many levels of symbolic links`, "point the link at a file");
}

// Why TARGET cannot be replaced by a file, or null (a regular file or nothing there); its lstat in `out`.
function nodeProblem(target, out) {
  let st;
  try {
    st = lstatSync(target);
  } catch (e) {
    return e.code === "ENOENT" ? null : reason(e);
  }
  out.st = st;
  if (st.isFile()) return null;
  if (st.isDirectory()) return "Is a directory";
  return `not a regular file (${specialKind(st)})`;
}

const REFUSE_HINT = "give the token file a file name in a writable folder (an existing regular file is replaced; " +
  "devices, FIFOs and folders are never written)";

// The checks before any work (core::check_output_file): the target is a regular file or absent, its folder
// exists and is writable. Returns the target.
function checkOutput(path) {
  const target = outputTarget(path);
  const via = target === path ? "" : ` (the symbolic link's target ${target})`;
  const why = nodeProblem(target, {});
  if (why !== null)
    fail(`${path}: cannot write the token file${via}: ${why}`, REFUSE_HINT);
  const dir = dirname(target);
  try {
    if (!statSync(dir).isDirectory()) throw Object.assign(new Error("not a folder"), { code: "ENOTDIR" });
    accessSync(dir, constants.W_OK | constants.X_OK);
  } catch (e) {
    fail(`${path}: cannot write the token file${via}: folder ${dir}: ${reason(e)}`,
      "create the folder, or choose a writable one; nothing was tokenized");
  }
  return target;
}

// PATH's bytes replaced atomically (core::AtomicFile): TARGET.tmp beside the target, fsync, rename over it, fsync
// the folder; the temp file removed on any failure, the previous file left as it was.
function writeAtomic(path, bytes) {
  const target = outputTarget(path);
  const st = {};
  const why = nodeProblem(target, st);  // again: the node may have changed while the text was tokenized
  if (why !== null) fail(`${path}: cannot write the token file: ${why}`, REFUSE_HINT);
  const tmp = `${target}.tmp`;
  let fd = -1;
  let created = false;
  try {
    fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW, 0o666);
    created = true;
    if (st.st) fchmodSync(fd, st.st.mode & 0o7777);  // keep the replaced file's permissions
    for (let off = 0; off < bytes.length;) off += writeSync(fd, bytes, off, bytes.length - off);
    fsyncSync(fd);
    closeSync(fd);
    fd = -1;
    renameSync(tmp, target);
    created = false;
  } catch (e) {
    if (fd >= 0) closeSync(fd);
    if (created) {
      try {
        unlinkSync(tmp);
      } catch {}
    }
    fail(`${path}: cannot write the token file: ${reason(e)}`,
      `${e.code === "EFBIG" ? "raise the file size limit (ulimit -f)" : "free space"} or choose another path; ` +
        `${path} was left as it was`);
  }
  try {
    const dfd = openSync(dirname(target), "r");
    try {
      fsyncSync(dfd);
    } catch (e) {
      if (e.code !== "EINVAL") throw e;  // a file system without directory fsync
    } finally {
      closeSync(dfd);
    }
  } catch (e) {
    fail(`${path}: written, but syncing its folder failed: ${reason(e)}`, "check the disk and write it again");
  }
}

const args = process.argv.slice(2);
const eot = !args.includes("--no-eot");
const print = args.includes("--print");
const paths = args.filter((a) => !a.startsWith("--"));
const unknown = args.filter((a) => a.startsWith("--") && a !== "--no-eot" && a !== "--print");
if (unknown.length > 0) fail(`unknown option ${unknown[0]}; usage: tokenize.mjs IN.txt [...] OUT.bin [--no-eot] [--print]`);
if (paths.length < 2) fail("usage: node scripts/tokenizer/tokenize.mjs IN.txt [IN2.txt ...] OUT.bin [--no-eot] [--print]");
const out = paths.pop();
checkOutput(out);  // before the work, as the C++ tools check theirs

const enc = new Tiktoken(gpt2);
const ids = [];
for (const p of paths) {
  let text;
  try {
    // Regular files only, as core::open_input_file: a FIFO would block, a device never end.
    const st = statSync(p);
    if (st.isDirectory()) throw Object.assign(new Error("Is a directory"), { code: "EISDIR" });
    if (!st.isFile()) throw new Error(`not a regular file (${specialKind(st)})`);
    text = readFileSync(p, "utf8");
  } catch (e) {
    fail(`${p}: cannot read the text: ${reason(e)}`);
  }
  if (eot) ids.push(EOT);
  // Like tiktoken's encode_ordinary: "<|endoftext|>" inside a text is ordinary text, not the special token.
  for (const t of enc.encode(text, [], [])) ids.push(t);
}
if (ids.length === 0) fail(`${paths.join(", ")}: no tokens (empty text and --no-eot)`);
if (ids.length > 0x7fffffff) fail(`${ids.length} tokens do not fit llm.c's int32 token count; split the text`);

const header = new Int32Array(256);
header[0] = MAGIC;
header[1] = 1;
header[2] = ids.length;
const body = new Uint16Array(ids);  // every GPT-2 id is < 50257 < 65536
const bytes = Buffer.concat([Buffer.from(header.buffer), Buffer.from(body.buffer)]);
writeAtomic(out, bytes);
if (print) process.stdout.write(JSON.stringify(ids) + "\n");
process.stderr.write(`tokenize: ${ids.length} GPT-2 tokens from ${paths.length} file(s) -> ${out}\n`);

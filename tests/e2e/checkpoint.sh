#!/usr/bin/env bash
# Checkpoint and restart (issue 13): a job stopped by SIGUSR2 (checkpoint,
# exit 75) resumes with the same command on another rank count and layer map,
# and the final out.jsonl — digests included — is byte-identical to an
# uninterrupted run, for each cache policy, seeded sampling and speculation
# (n-gram, a draft model, --draft-async). SIGUSR1
# checkpoints and goes on (the last two kept); kill -9 after a checkpoint
# loses nothing; a damaged newest checkpoint falls back to the previous one,
# two damaged ones to a fresh start; a failed checkpoint (full disk) leaves
# the previous one and the decode goes on; another model is refused.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 8 \
  --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 40 --embed-rows 12 --prompt-tokens 3 --max-new 300 --seed 6 \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
# the same pages and 2960 more (P is its first 40 lines): a job on it is still
# decoding when the test ends it, however fast the machine, so a signal sent
# after its first line lands in a running job; its lines are compared with
# an uninterrupted run's first lines (same_prefix)
"$PIPEDEC" mkpages --model "$m" --count 3000 --embed-rows 12 --prompt-tokens 3 --max-new 300 --seed 6 \
  --out "$T/long" >/dev/null
PA="$T/long/pages.jsonl"
# a draft model for --draft model: (another seed, the target's hidden size:
# it reads the page embeddings); the resumed run's draft model sees every
# stream for the first time and runs its context from the start
"$PIPEDEC" mkmodel --arch llama --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 64 --vocab 320 --seed 21 \
  --out "$T/d.gguf" >/dev/null
cmp -s <(head -n 40 "$PA") "$P" || fail "the long manifest does not start with the 40 pages"
MPIRUN=(mpirun --oversubscribe --bind-to none)

# launch N OUT DIR SIGNAL extra...: starts a job on the 3000 pages (it cannot
# end before the test ends it), sends SIGNAL (to mpirun, which forwards it to
# every rank) once the first page is out, waits; the exit status lands in
# OUT.rc
launch() {
  local n="$1" out="$2" dir="$3" sig="$4"; shift 4
  local cmd=("$PIPEDEC" run --model "$m" --pages "$PA" --out "$out" --batch 3 --digest --checkpoint-dir "$dir"
             --pid-file "$out.pids" --stats "$out.stats" "$@")
  [ "$n" -gt 0 ] && cmd=("${MPIRUN[@]}" -np "$n" "${cmd[@]}")
  ( rc=0; timeout 300 "${cmd[@]}" >"$out.log" 2>&1 </dev/null || rc=$?; echo "$rc" > "$out.rc" ) &
  local job=$!
  for _ in $(seq 1 3000); do [ -s "$out" ] && [ -s "$out.pids" ] && break; sleep 0.01; done
  # mpirun forwards the signal to every rank (the mpirun this test started);
  # alone, pipedec gets it
  local target
  if [ "$n" -gt 0 ]; then target=$(pgrep -f -o "^mpirun.*--out $out " || true)
  else target=$(rank_pid "$out" 0); fi
  [ -n "$target" ] && kill -"$sig" "$target" 2>/dev/null || true
  wait "$job" || true
}

# rerun N OUT DIR extra...: the same command line resumed in the background
# and stopped again (SIGUSR2 to rank 0, from its pid file) once it wrote two
# more pages, so no run waits for 3000 pages; exit status in OUT.rc2
rerun() {
  local n="$1" out="$2" dir="$3"; shift 3
  local k
  k=$(wc -l < "$out")
  local cmd=("$PIPEDEC" run --model "$m" --pages "$PA" --out "$out" --batch 3 --digest --checkpoint-dir "$dir"
             --pid-file "$out.pids" "$@")
  [ "$n" -gt 0 ] && cmd=("${MPIRUN[@]}" -np "$n" "${cmd[@]}")
  rm -f "$out.pids" "$out.rc2"
  ( rc=0; timeout 300 "${cmd[@]}" >"$out.resume.log" 2>&1 </dev/null || rc=$?; echo "$rc" > "$out.rc2" ) &
  local job=$!
  for _ in $(seq 1 30000); do
    [ -e "$out.rc2" ] && break
    [ "$(wc -l < "$out")" -gt "$((k + 1))" ] && [ -s "$out.pids" ] && break
    sleep 0.01
  done
  kill -USR2 "$(rank_pid "$out" 0)" 2>/dev/null || true
  wait "$job" || true
}

# same_prefix OUT WHAT [policy...]: OUT's k lines (k >= 1, a job stopped
# midway on PA) are the first k lines of an uninterrupted one-rank run under
# the same policy
same_prefix() {
  local out="$1" what="$2" k; shift 2
  k=$(wc -l < "$out")
  rm -f "$T/prefix.ref" # a run onto an existing output skips the pages in it
  if [ "$k" -le 40 ] && [ $# -eq 0 ]; then
    head -n "$k" "$T/s1-3_.ref" > "$T/prefix.ref"
  else
    head -n "$k" "$PA" > "$T/long/first.jsonl"
    "$PIPEDEC" run --model "$m" --pages "$T/long/first.jsonl" --out "$T/prefix.ref" --batch 3 --digest "$@" >/dev/null 2>&1
  fi
  [ "$k" -ge 1 ] && [ "$k" -lt 3000 ] || fail "$what: $k of 3000 pages written (the job should have been ended midway)"
  same "$T/prefix.ref" "$out" "$what ($k pages)"
}

"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/s1-3_.ref" --batch 3 --digest >/dev/null 2>&1

# stop on N1 ranks, resume on N2 with MAP (0 = no mpirun), per policy; on
# one node the stages take turns unless --micro-batches pipeline (never on
# 4 ranks here: 4 pipelined ranks on 2 cores under the sanitizers took 35 s
# for one resume)
cases=(
  "1|3|0,1-2,3|"
  "2|1||--kv q8"
  "3|4|0,1,2,3|--attn rswa:8"
  "2|3|0,1-2,3|--attn rswa:8 --kv q8"
  "1|2||--draft ngram:1:6 --evict importance:16:2"
  "2|1||--draft ngram:1:6 --draft-async --evict recent:16"
  "4|2|0-2,3|--evict importance:16:2 --micro-batches pipeline"
  "0|2|0,1-3|--sample temp:0.8,top_p:0.9,top_k:40 --seed 3"
  "1|2|0-1,2-3|--draft ngram:1:6 --micro-batches pipeline"
  "3|2||--draft ngram:1:6 --draft-async"
  "2|1||--draft model:$T/d.gguf:3"
  "1|3|0,1-2,3|--draft model:$m:3 --draft-async --sample temp:0.8,top_p:0.9 --seed 3"
)
for c in "${cases[@]}"; do
  IFS='|' read -r n1 n2 map pol <<<"$c"
  tag=$(echo "s$n1-$n2${pol//$T\//}" | tr -c 'a-zA-Z0-9-' '_')
  # shellcheck disable=SC2086
  launch "$n1" "$T/$tag.out" "$T/$tag.d" USR2 $pol
  rc=$(cat "$T/$tag.out.rc")
  if [ "$rc" -eq 75 ] && [ -d "$T/$tag.d/ckpt-1" ] && [ "$(wc -l < "$T/$tag.out")" -lt 3000 ] \
     && grep -qE '"exit_status":[[:space:]]*75' "$T/$tag.out.stats"; then
    pass "$tag: SIGUSR2 checkpointed and exited 75 (so its --stats says) with $(wc -l < "$T/$tag.out") of 3000 pages out"
  else
    fail "$tag: exit $rc after SIGUSR2"; tail -3 "$T/$tag.out.log"
  fi
  extra=(); [ -n "$map" ] && extra=(--layers "$map")
  # shellcheck disable=SC2086
  rerun "$n2" "$T/$tag.out" "$T/$tag.d" "${extra[@]}" $pol
  [ "$(cat "$T/$tag.out.rc2")" = 75 ] || fail "$tag: the resumed run exited $(cat "$T/$tag.out.rc2")"
  grep -q "resuming from" "$T/$tag.out.resume.log" || fail "$tag: the rerun did not say it resumed"
  # shellcheck disable=SC2086
  same_prefix "$T/$tag.out" "$tag: resumed on ${n2} rank(s) ${map:+(map $map) }== uninterrupted" $pol
done

# a signal to one rank that is not the head: it travels on the next message
# to the head, and the whole job acts on it (rank 1 middle: SIGUSR1, then the
# tail rank 2: SIGUSR2); batch 1, so the job is still running when they land
# (at batch 3 a fast CPU finished it first)
out="$T/onerank.jsonl"; d="$T/onerank.d"
( rc=0; timeout 300 "${MPIRUN[@]}" -np 3 "$PIPEDEC" run --model "$m" --pages "$PA" --out "$out" --batch 3 --digest \
    --checkpoint-dir "$d" --pid-file "$out.pids" >"$out.log" 2>&1 </dev/null || rc=$?; echo "$rc" > "$out.rc" ) &
job=$!
for _ in $(seq 1 3000); do [ -s "$out" ] && [ -s "$out.pids" ] && break; sleep 0.01; done
# each signal is sent again every 0.5 s until it shows (once failed in CI
# with exit 0 and no checkpoint, not reproduced; the notes below say at
# which line and to which pid it went)
notes=""
for _ in $(seq 1 60); do
  [ -d "$d/ckpt-1" ] || [ -e "$out.rc" ] && break
  p1=$(rank_pid "$out" 1); kill -USR1 "$p1" 2>/dev/null || true
  notes="$notes USR1->${p1:-none}@$(wc -l < "$out")"
  for _ in $(seq 1 50); do [ -d "$d/ckpt-1" ] && break; sleep 0.01; done
done
for _ in $(seq 1 60); do
  [ -e "$out.rc" ] && break
  p2=$(rank_pid "$out" 2); kill -USR2 "$p2" 2>/dev/null || true
  notes="$notes USR2->${p2:-none}@$(wc -l < "$out")"
  for _ in $(seq 1 50); do [ -e "$out.rc" ] && break; sleep 0.01; done
done
wait "$job" || true
n_ck=$(grep -c "written at step" "$out.log" || true)
if [ "$(cat "$out.rc")" -eq 75 ] && [ "$n_ck" -ge 2 ] && [ "$(ls "$d" | grep -c '^ckpt-')" -eq 2 ]; then
  pass "SIGUSR1 to rank 1 and SIGUSR2 to rank 2 alone: the whole job checkpointed ($n_ck) and exited 75"
else
  fail "signals to non-head ranks: exit $(cat "$out.rc"), $n_ck checkpoints, kept: $(ls "$d" 2>/dev/null | tr '\n' ' '), signals:$notes"
  grep -i "checkpoint\|signal" "$out.log" | head -5
fi
rerun 2 "$out" "$d"
same_prefix "$out" "signals to non-head ranks: resumed output == uninterrupted"

# wait_lines OUT N: waits (up to 30 s) until OUT has more than N lines
wait_lines() {
  for _ in $(seq 1 3000); do [ "$(wc -l < "$1")" -gt "$2" ] && return; sleep 0.01; done
}

# SIGUSR1 checkpoints and goes on (it writes more pages after the
# checkpoints); the last two are kept. SIGUSR2 then ends the long job.
out="$T/u1.jsonl"; d="$T/u1.d"
( rc=0; timeout 300 "$PIPEDEC" run --model "$m" --pages "$PA" --out "$out" --batch 3 --digest --checkpoint-dir "$d" \
    --pid-file "$out.pids" >"$out.log" 2>&1 || rc=$?; echo "$rc" > "$out.rc" ) &
job=$!
for _ in $(seq 1 3000); do [ -s "$out" ] && [ -s "$out.pids" ] && break; sleep 0.01; done
pid=$(rank_pid "$out" 0)
for _ in 1 2 3; do kill -USR1 "$pid" 2>/dev/null || true; sleep 0.05; done
for _ in $(seq 1 3000); do grep -q "written at step" "$out.log" && break; sleep 0.01; done
wait_lines "$out" "$(wc -l < "$out")"
n_ck=$(grep -c "written at step" "$out.log" || true)
kill -USR2 "$pid" 2>/dev/null || true
wait "$job" || true
if [ "$(cat "$out.rc")" -eq 75 ] && [ "$n_ck" -ge 1 ] && [ "$(ls "$d" | grep -c '^ckpt-')" -le 2 ]; then
  pass "SIGUSR1: $n_ck checkpoint(s) written, decoding went on, at most two kept (then SIGUSR2: exit 75)"
else
  fail "SIGUSR1: exit $(cat "$out.rc"), $n_ck checkpoints, kept: $(ls "$d" | tr '\n' ' ')"
fi
same_prefix "$out" "SIGUSR1: output == uninterrupted"

# kill -9 of the whole job after a checkpoint: the rerun resumes, nothing lost or duplicated
out="$T/k9.jsonl"; d="$T/k9.d"
( rc=0; timeout 300 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$PA" --out "$out" --batch 3 --digest \
    --checkpoint-dir "$d" --checkpoint-every 3600 >"$out.log" 2>&1 </dev/null || rc=$?; echo "$rc" > "$out.rc" ) &
job=$!
for _ in $(seq 1 3000); do [ -s "$out" ] && break; sleep 0.01; done
kill -USR1 "$(pgrep -f -o "^mpirun.*--out $out " || echo 0)" 2>/dev/null || true
for _ in $(seq 1 30000); do [ -d "$d/ckpt-1" ] || [ -e "$out.rc" ] && break; sleep 0.01; done
pkill -9 -f "pipedec run --model $m --pages $PA --out $out " || true
wait "$job" || true
[ -d "$d/ckpt-1" ] || fail "kill -9: no checkpoint was written before the kill"
rerun 2 "$out" "$d"
grep -q "resuming from" "$out.resume.log" && pass "kill -9: the rerun resumed from the last published checkpoint" \
  || fail "kill -9: the rerun did not resume"
same_prefix "$out" "kill -9 after a checkpoint: nothing lost or duplicated"

# a damaged newest checkpoint falls back to the previous one. The job runs
# on the 3000 pages, so it cannot end before the test has its two
# checkpoints: SIGUSR2 goes only once ckpt-1 exists (a pending SIGUSR1 and
# SIGUSR2 would make one checkpoint)
out="$T/twock.jsonl"; d="$T/twock.d"
( rc=0; timeout 300 "$PIPEDEC" run --model "$m" --pages "$PA" --out "$out" --batch 3 --digest --checkpoint-dir "$d" \
    --pid-file "$out.pids" >"$out.log" 2>&1 || rc=$?; echo "$rc" > "$out.rc" ) &
job=$!
for _ in $(seq 1 3000); do [ -s "$out" ] && [ -s "$out.pids" ] && break; sleep 0.01; done
pid=$(rank_pid "$out" 0)
kill -USR1 "$pid" 2>/dev/null || true
for _ in $(seq 1 30000); do [ -d "$d/ckpt-1" ] || [ -e "$out.rc" ] && break; sleep 0.01; done
kill -USR2 "$pid" 2>/dev/null || true
wait "$job" || true
if [ -d "$d/ckpt-1" ] && [ -d "$d/ckpt-2" ]; then
  printf '\x55' | dd of="$d/ckpt-2/layer-00001.cmfb" bs=1 seek=40 conv=notrunc 2>/dev/null
  cp -a "$d" "$T/twock.copy" # for inspect and the both-damaged case below
  # the rerun resumes from ckpt-1, writes a few more pages, and is stopped
  k=$(wc -l < "$out")
  ( rc=0; timeout 300 "$PIPEDEC" run --model "$m" --pages "$PA" --out "$out" --batch 3 --digest --checkpoint-dir "$d" \
      --pid-file "$out.pids" >"$out.resume.log" 2>&1 || rc=$?; echo "$rc" > "$out.rc" ) &
  job=$!
  for _ in $(seq 1 30000); do [ "$(wc -l < "$out")" -gt "$((k + 1))" ] && [ -s "$out.pids" ] && break; sleep 0.01; done
  kill -USR2 "$(rank_pid "$out" 0)" 2>/dev/null || true
  wait "$job" || true
  grep -q "checkpoint 2 is not usable.*CRC32C" "$out.resume.log" && grep -q "resuming from .*ckpt-1" "$out.resume.log" \
    && pass "a damaged newest checkpoint is reported and the previous one used" || { fail "damaged newest"; head -3 "$out.resume.log"; }
  same_prefix "$out" "resumed from the previous checkpoint == uninterrupted"
  d="$T/twock.copy"
else
  fail "could not make two checkpoints ($(ls "$d" | tr '\n' ' '), exit $(cat "$out.rc" 2>/dev/null))"
fi

# pipedec inspect validates a checkpoint: the good one, the damaged one
if [ -d "$d/ckpt-1" ]; then
  "$PIPEDEC" inspect "$d/ckpt-1" > "$T/insp.txt" && grep -q "^valid: yes" "$T/insp.txt" \
    && pass "inspect: the previous checkpoint is valid" || fail "inspect of a good checkpoint"
  "$PIPEDEC" inspect "$d/ckpt-1" --json | python3 -c "import json,sys; j=json.load(sys.stdin); assert j['valid'] and j['kind']=='checkpoint' and j['layers']==4" \
    && pass "inspect --json describes it" || fail "inspect --json of a checkpoint"
  expect_fail "inspect: the damaged checkpoint" "layer-00001.cmfb: CRC32C does not match" "$PIPEDEC" inspect "$d/ckpt-2"
fi

# both damaged: reported, and the run starts from scratch (same bytes)
if [ -d "$d/ckpt-1" ]; then
  printf '\x55' | dd of="$d/ckpt-1/manifest.pdck" bs=1 seek=20 conv=notrunc 2>/dev/null
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/scratch.jsonl" --batch 3 --digest --checkpoint-dir "$d" \
    >/dev/null 2>"$T/scratch.err" || fail "both damaged: exit $?"
  grep -q "checkpoint 1 is not usable" "$T/scratch.err" && grep -q "starting from scratch" "$T/scratch.err" \
    && pass "both checkpoints damaged: reported, started from scratch" || { fail "both damaged"; head -3 "$T/scratch.err"; }
  same "$T/s1-3_.ref" "$T/scratch.jsonl" "from scratch == uninterrupted"
fi

# another model's checkpoint is refused, naming it
"$PIPEDEC" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 9 \
  --out "$T/other.gguf" >/dev/null
expect_fail "a checkpoint of another model" "written with another model" \
  "$PIPEDEC" run --model "$T/other.gguf" --pages "$P" --out "$T/other.out" --batch 3 --checkpoint-dir "$T/u1.d"

# a full disk during the checkpoint: reported, previous intact, the decode
# goes on (more pages written after it); SIGINT then ends the long job (130)
out="$T/full.jsonl"; d="$T/full.d"
mkdir -p "$d"
( rc=0; ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
  PD_FULL_DISK_PATH="$(realpath "$d")/.ckpt-1.??????/layer-00000.cmfb" PD_FULL_DISK_BYTES=100 \
  LD_PRELOAD="$PD_BUILD/tests/libpd_full_disk.so" timeout 300 "$PIPEDEC" run --model "$m" --pages "$PA" --out "$out" \
  --batch 3 --digest --checkpoint-dir "$d" --pid-file "$out.pids" >"$out.log" 2>&1 || rc=$?; echo "${rc:-0}" > "$out.rc" ) &
job=$!
for _ in $(seq 1 3000); do [ -s "$out" ] && [ -s "$out.pids" ] && break; sleep 0.01; done
pid=$(rank_pid "$out" 0)
kill -USR1 "$pid" 2>/dev/null || true
for _ in $(seq 1 3000); do grep -q "checkpoint 1 failed" "$out.log" && break; sleep 0.01; done
wait_lines "$out" "$(wc -l < "$out")"
kill -INT "$pid" 2>/dev/null || true
wait "$job" || true
if [ "$(cat "$out.rc")" -eq 130 ] && grep -q "checkpoint 1 failed.*No space left on device" "$out.log" \
   && [ ! -e "$d/ckpt-1" ] && [ -z "$(ls -A "$d")" ]; then
  pass "full disk during a checkpoint: reported, nothing published, no temporary left, decode went on"
else
  fail "full disk during a checkpoint: exit $(cat "$out.rc")"; grep -i checkpoint "$out.log" | head -3
fi
same_prefix "$out" "full disk during a checkpoint: output == uninterrupted"
finish

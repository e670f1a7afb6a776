#!/usr/bin/env bash
# slurm/pipedec.sbatch on a real (private) Slurm: (a) an array over a
# manifest split into 3 shards, merged, is byte-identical (digests included)
# to one `pipedec run` over the whole manifest; (b) a running task preempted
# with `scancel --batch --signal=USR1` checkpoints, exits 75, requeues
# itself, and once released resumes from its checkpoint (its log says so),
# the merged result still byte-identical; (d) a shard holding a malformed page
# fails its task with the page named in the task's log, and `pipedec merge`
# names the missing ids and writes nothing. The time-limit case is
# tests/slurm/timelimit.sh.
source "$(dirname "$0")/lib.bash"
slurm_up
W="$SL/work"
P="$PD_BUILD/pipedec"
SBATCH="$PD_SRC/slurm/pipedec.sbatch"

# submit NAME SHARDS_DIR ARGS...: submits the array, prints the array job id
submit() {
  local name="$1" shards="$2"; shift 2
  PIPEDEC="${WRAP:-$P}" PD_MODEL="$W/$name.gguf" PD_SHARDS="$shards" PD_WORK="$W/$name.run" \
    sbatch --parsable -o "$W/$name.run/log_%a.log" "$@" "$SBATCH"
}

# merge_after NAME ARRAY_JOB: submits slurm/merge.sbatch after the array, prints its job id
merge_after() {
  PIPEDEC="$P" PD_PAGES="$W/$1.pages/pages.jsonl" PD_WORK="$W/$1.run" \
    sbatch --parsable --dependency="afterok:$2" -o "$W/$1.run/merge.log" "$PD_SRC/slurm/merge.sbatch"
}

# states ARRAY_JOB: "task=state:exit:restarts" of every task
states() {
  local id
  for id in $(scontrol show job "$1" 2>/dev/null | sed -n 's/^JobId=\([0-9]*\) .*/\1/p'); do
    echo "$(job_field "$id" ArrayTaskId)=$(job_state "$id"):$(job_field "$id" ExitCode):restarts$(job_field "$id" Restarts)(job $id)"
  done | sort | tr '\n' ' '
}

# ---- (a) array of 3 shards == one run over the whole manifest ---------------
"$P" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 8 \
  --out "$W/a.gguf" >/dev/null
"$P" mkpages --model "$W/a.gguf" --count 20 --embed-rows 12 --prompt-tokens 3 --max-new 40 --mixed --seed 6 \
  --out "$W/a.pages" >/dev/null
"$P" shard --pages "$W/a.pages/pages.jsonl" --shards 3 --out "$W/a.shards" >/dev/null
mkdir -p "$W/a.run"
"$PIPEDEC" run --model "$W/a.gguf" --pages "$W/a.pages/pages.jsonl" --out "$W/a.ref" --digest 2>/dev/null
ja=$(PD_RUN_ARGS="--digest --batch 4" submit a "$W/a.shards" --array=0-2)
jam=$(merge_after a "$ja")
wait_done 120 "$ja" "$jam" || fail "(a) array $ja and merge $jam did not finish"
echo "# (a) array job $ja: $(states "$ja")"
n_done=$(states "$ja" | grep -o "=COMPLETED:0:0" | wc -l)
[ "$n_done" -eq 3 ] && pass "(a) array $ja: 3 tasks COMPLETED, exit 0" || fail "(a) array $ja: $(states "$ja")"
[ "$(job_state "$jam")" = COMPLETED ] && pass "(a) slurm/merge.sbatch (job $jam, afterok:$ja) COMPLETED" \
  || { fail "(a) merge job $jam: $(job_state "$jam")"; cat "$W/a.run/merge.log"; }
same "$W/a.ref" "$W/a.run/final.jsonl" "(a) 3 shards on Slurm, merged == one run over the manifest"
grep -q '"pages_done":' "$W/a.run/stats/shard-0.run0.json" 2>/dev/null && pass "(a) each task wrote its --stats" \
  || fail "(a) no stats in $W/a.run/stats"

# the mpirun variant (PD_LAUNCH=mpirun), one task: the same bytes as srun's
cp "$W/a.gguf" "$W/a2.gguf"; mkdir -p "$W/a2.run"
ja2=$(PD_LAUNCH=mpirun PD_RUN_ARGS="--digest --batch 3" submit a2 "$W/a.shards" --array=1 2>/dev/null || true)
if [ -n "$ja2" ]; then
  wait_done 120 "$ja2" || fail "(a) mpirun task $ja2 did not finish"
  echo "# (a) mpirun task: $(states "$ja2")"
  same "$W/a.run/out/shard-1.jsonl" "$W/a2.run/out/shard-1.jsonl" \
    "(a) the mpirun variant (PD_LAUNCH=mpirun) writes shard 1 exactly as srun did"
else
  fail "(a) the mpirun variant could not be submitted"
fi

# ---- (b) preempted task: checkpoint, exit 75, requeue, resume ---------------
# a model slow enough that a shard runs for several seconds: the USR1 below
# must reach a step that still has pages to go (with 20 pages a shard took
# 3 s, and on a loaded CI machine the signal arrived as its last page was
# written, so nothing was requeued)
"$P" mkmodel --arch llama --layers 8 --hidden 256 --heads 4 --kv-heads 2 --ffn 768 --vocab 320 --seed 8 \
  --eos-boost 0.001 --ctx 4096 --out "$W/b.gguf" >/dev/null
"$P" mkpages --model "$W/b.gguf" --count 40 --embed-rows 12 --prompt-tokens 3 --max-new 200 --seed 6 \
  --out "$W/b.pages" >/dev/null
"$P" shard --pages "$W/b.pages/pages.jsonl" --shards 3 --out "$W/b.shards" >/dev/null
mkdir -p "$W/b.run"
jb=$(PD_RUN_ARGS="--digest --batch 2" submit b "$W/b.shards" --array=0-2)
jbm=$(merge_after b "$jb")
"$PIPEDEC" run --model "$W/b.gguf" --pages "$W/b.pages/pages.jsonl" --out "$W/b.ref" --digest --batch 5 2>/dev/null &
ref_pid=$!
# preempt task 0 once it has finished a page (so there is something to keep)
for _ in $(seq 1 600); do [ -s "$W/b.run/out/shard-0.jsonl" ] && break; sleep 0.05; done
lines_before=$(wc -l < "$W/b.run/out/shard-0.jsonl" 2>/dev/null || echo 0)
scancel --batch --signal=USR1 "${jb}_0"
tb=""
for _ in $(seq 1 300); do
  tb=$(squeue -h -j "${jb}_0" -t PENDING -o %A 2>/dev/null || true)
  [ -n "$tb" ] && break
  sleep 0.1
done
if [ -n "$tb" ] && [ "$(job_field "$tb" Restarts)" = 1 ]; then
  pass "(b) task ${jb}_0 (job $tb) requeued itself after USR1: $(job_state "$tb") ($(job_field "$tb" Reason)), Restarts=1, $lines_before page(s) kept"
  # release it once the first run's step daemons are gone: a step of the
  # rerun started while the old one is still being torn down fails to launch
  # (on a real cluster the requeue delay of ~2 minutes covers this)
  for _ in $(seq 1 600); do
    pgrep -f "^slurmstepd: \[$tb\." >/dev/null || [ -n "$(scontrol show job "$tb" | grep -o COMPLETING)" ] || break
    sleep 0.1
  done
  # and not within the second of the requeue: slurmd revokes the old run's
  # credential with a timestamp in whole seconds and refuses a new one made
  # in that same second ("Job credential revoked", the task then FAILS)
  sleep 2
  scontrol update JobId="$tb" StartTime=now
else
  fail "(b) task ${jb}_0 was not requeued: $(states "$jb")"; tail -5 "$W/b.run/log_0.log"
fi
wait_done 180 "$jb" "$jbm" || fail "(b) array $jb and merge $jbm did not finish"
wait "$ref_pid" || fail "(b) the reference run failed"
echo "# (b) array job $jb: $(states "$jb")"
log0="$W/b.run/log_0.log"
grep -q "USR1: time limit or preemption near" "$log0" && grep -q "exiting (resumable, status 75)" "$log0" \
  && grep -q "checkpointed (exit 75); requeueing" "$log0" \
  && pass "(b) the batch shell forwarded USR1, the step checkpointed and exited 75, the shell requeued" \
  || { fail "(b) the preemption path is not in the log"; cat "$log0"; }
resume=$(grep "resuming from .*ckpt/shard-0/ckpt-" "$log0" || true)
if [ -n "$resume" ] && grep -q "restart 1 on" "$log0"; then
  pass "(b) the rerun (SLURM_RESTART_COUNT=1) resumed: ${resume#pipedec: }"
else
  fail "(b) the rerun did not say it resumed from its checkpoint"; cat "$log0"
  grep -h "$tb" "$SL/log/slurmctld.log" "$SL/log/slurmd.log" | tail -30
fi
states "$jb" | grep -q "^0=COMPLETED:0:0:restarts1" && pass "(b) task 0 ended COMPLETED after one restart" \
  || fail "(b) task states: $(states "$jb")"
[ "$(job_state "$jbm")" = COMPLETED ] && pass "(b) the merge job $jbm (afterok:$jb) waited for the requeued task and COMPLETED" \
  || { fail "(b) merge job $jbm: $(job_state "$jbm")"; cat "$W/b.run/merge.log"; }
same "$W/b.ref" "$W/b.run/final.jsonl" "(b) preempted, requeued and resumed on Slurm, merged == one run over the manifest"
# exit 75 without the grace signal (a SIGUSR2 to the step alone, as from an
# admin): the task ends FAILED 75:0 -- not a failure of the shard -- and the
# resubmitted task resumes; its shard's output equals the one above. Rank 0
# here lingers after pipedec returns, so srun (--kill-on-bad-exit) always
# stops it once rank 1 has exited 75 and reports 143 for the step -- the race
# a real cluster loses now and then: the batch shell must go by the status
# pipedec's head recorded in --stats before any rank left.
cp "$W/b.gguf" "$W/b75.gguf"; mkdir -p "$W/b75.run"
cat > "$W/late-head.sh" <<EOS
#!/bin/bash
trap : USR1 USR2   # the step's signals are for pipedec (it gets the default action back at exec)
rc=0; "$P" "\$@" || rc=\$?
if [ "\${SLURM_PROCID:-0}" = 0 ] && [ "\$rc" -ne 0 ]; then sleep 5; fi
exit "\$rc"
EOS
chmod +x "$W/late-head.sh"
jx=$(WRAP="$W/late-head.sh" PD_RUN_ARGS="--digest --batch 2" submit b75 "$W/b.shards" --array=1)
for _ in $(seq 1 600); do [ -s "$W/b75.run/out/shard-1.jsonl" ] && break; sleep 0.05; done
scancel --signal=USR2 "${jx}_1"
wait_done 120 "$jx" || fail "(b) task ${jx}_1 did not end"
echo "# (b) step signalled alone: $(states "$jx")"
grep -q "the step exited 143, but pipedec's head had recorded exit status 75" "$W/b75.run/log_1.log" \
  && pass "(b) srun stopped the lingering head (143); the batch shell went by the head's recorded status 75" \
  || { fail "(b) the step's 143 was not overruled by the head's record"; tail -8 "$W/b75.run/log_1.log"; }
states "$jx" | grep -q "^1=FAILED:75:0" && grep -q "checkpointed (exit 75) without a requeue request" "$W/b75.run/log_1.log" \
  && pass "(b) a checkpoint-and-exit without the grace signal ends FAILED with ExitCode 75:0, the log says resubmit" \
  || { fail "(b) exit 75 without USR1: $(states "$jx")"; tail -5 "$W/b75.run/log_1.log"; }
jx2=$(PD_RUN_ARGS="--digest --batch 2" submit b75 "$W/b.shards" --array=1)
wait_done 120 "$jx2" || fail "(b) resubmitted task ${jx2}_1 did not finish"
grep -q "resuming from .*b75.run/ckpt/shard-1/ckpt-1 " "$W/b75.run/log_1.log" \
  && pass "(b) the resubmitted task ${jx2}_1 resumed from its checkpoint" || fail "(b) ${jx2}_1 did not resume"
same "$W/b.run/out/shard-1.jsonl" "$W/b75.run/out/shard-1.jsonl" "(b) stopped with exit 75, resubmitted: shard 1 unchanged"

# the negative control: the same check sees a different decode
"$PIPEDEC" run --model "$W/b.gguf" --pages "$W/b.pages/pages.jsonl" --out "$W/b.other" --digest --batch 5 \
  --sample temp:0.9 --seed 4 2>/dev/null
differ "$W/b.ref" "$W/b.other" "(b) negative control: seeded sampling differs from greedy"

# ---- (d) a malformed page fails its task; merge names the missing ids -------
cp -r "$W/a.pages" "$W/d.pages"
cp "$W/a.gguf" "$W/d.gguf"
"$P" mkmodel --arch llama --layers 1 --hidden 32 --heads 2 --kv-heads 2 --ffn 32 --vocab 320 --out "$W/narrow.gguf" >/dev/null
"$P" mkpages --model "$W/narrow.gguf" --count 1 --embed-rows 12 --prompt-tokens 1 --out "$W/narrow" >/dev/null
cp "$W/narrow/p00000.npy" "$W/d.pages/p00009.npy"   # 32 wide: the model's hidden size is 64
"$P" shard --pages "$W/d.pages/pages.jsonl" --shards 3 --out "$W/d.shards" >/dev/null \
  && pass "(d) shard (no model at hand) accepts the manifest" || fail "(d) shard refused the manifest"
bad=$(grep -l '"p00009"' "$W/d.shards"/shard-*.jsonl | sed 's/.*shard-\([0-9]*\).jsonl/\1/')
mkdir -p "$W/d.run"
jd=$(PD_RUN_ARGS="--digest" submit d "$W/d.shards" --array=0-2)
wait_done 120 "$jd" || fail "(d) array $jd did not finish"
echo "# (d) array job $jd: $(states "$jd")"
states "$jd" | grep -q "^.*$bad=FAILED:1:0" && pass "(d) task $bad (the shard holding p00009) FAILED with exit 1" \
  || fail "(d) task $bad: $(states "$jd")"
[ "$(states "$jd" | grep -o "=COMPLETED:0:0" | wc -l)" -eq 2 ] && pass "(d) the other two tasks completed" \
  || fail "(d) the other tasks: $(states "$jd")"
grep -q 'shard-'"$bad"'.jsonl:[0-9]*: page "p00009": prefill\[1\].embeddings: .*does not match hidden size 64' \
  "$W/d.run/log_$bad.log" && pass "(d) the failed task's log names the page, file:line and field" \
  || { fail "(d) the failed task's log lacks the page"; cat "$W/d.run/log_$bad.log"; }
rc=0
"$P" merge --pages "$W/d.pages/pages.jsonl" --out-dir "$W/d.run/out" --out "$W/d.merged" >"$W/d.merge.out" 2>"$W/d.merge.err" || rc=$?
want=$(sed -n 's/.*"id":"\([^"]*\)".*/\1/p' "$W/d.shards/shard-$bad.jsonl" | sort | tr '\n' ' ')
got=$(sed -n 's/^missing: //p' "$W/d.merge.err" | sort | tr '\n' ' ')
if [ "$rc" -eq 1 ] && [ -n "$want" ] && [ "$want" = "$got" ] && [ ! -e "$W/d.merged" ]; then
  pass "(d) merge exits 1, lists exactly the failed shard's pages as missing ($got), writes nothing"
else
  fail "(d) merge: exit $rc, missing '$got', wanted '$want'"; cat "$W/d.merge.err"
fi
finish

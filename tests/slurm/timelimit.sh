#!/usr/bin/env bash
# slurm/pipedec.sbatch when a task hits its time limit with no window to
# checkpoint: no grace signal (--signal=B:USR1@0) and KillWait=0 (SIGKILL
# right after SIGTERM). What survives is the last periodic checkpoint
# (--checkpoint-every): the resubmitted task resumes from it, and the result
# is byte-identical to one uninterrupted run.
#
# Slurm's smallest time limit is one minute. Rather than decode for a whole
# minute on two shared cores, the test stops the ranks (SIGSTOP) once two
# periodic checkpoints are out; at the limit Slurm sends SIGCONT, SIGTERM and
# at once SIGKILL, as it does to any job that runs out of time.
#
# The task must outlive two one-second checkpoint periods on any CI machine:
# 12 pages (2400 tokens) took 1.9-2.5 s here and sometimes finished after one
# checkpoint; 48 pages give a margin of about four.
PD_SLURM_KILLWAIT=0
source "$(dirname "$0")/lib.bash"
slurm_up
W="$SL/work"
P="$PD_BUILD/pipedec"

"$P" mkmodel --arch llama --layers 8 --hidden 256 --heads 4 --kv-heads 2 --ffn 768 --vocab 320 --seed 8 \
  --eos-boost 0.001 --ctx 4096 --out "$W/c.gguf" >/dev/null
"$P" mkpages --model "$W/c.gguf" --count 48 --embed-rows 12 --prompt-tokens 3 --max-new 200 --seed 7 \
  --out "$W/c.pages" >/dev/null
"$P" shard --pages "$W/c.pages/pages.jsonl" --shards 1 --out "$W/c.shards" >/dev/null
mkdir -p "$W/c.run"
run_env=(env PIPEDEC="$P" PD_MODEL="$W/c.gguf" PD_SHARDS="$W/c.shards" PD_WORK="$W/c.run" PD_CKPT_EVERY=1
         PD_RUN_ARGS="--digest --batch 2")
j=$("${run_env[@]}" sbatch --parsable --array=0 --time=1 --signal=B:USR1@0 -o "$W/c.run/log_%a.log" \
    "$PD_SRC/slurm/pipedec.sbatch")
"$PIPEDEC" run --model "$W/c.gguf" --pages "$W/c.pages/pages.jsonl" --out "$W/c.ref" --digest --batch 4 2>/dev/null &
ref_pid=$!
ck="$W/c.run/ckpt/shard-0"
newest_ckpt() { ls -1 "$ck" | sed -n 's/^ckpt-\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1; }
for _ in $(seq 1 600); do [ -d "$ck/ckpt-2" ] && break; sleep 0.05; done
pids=$(pgrep -f "^$P run .*--out $W/c.run/out/shard-0.jsonl " || true)
if [ -d "$ck/ckpt-2" ] && [ -n "$pids" ]; then
  # shellcheck disable=SC2086
  kill -STOP $pids
  # the newest published directory, not the newest log line: a rank
  # stopped between publishing ckpt-N (one rename) and logging it leaves
  # ckpt-N complete and unlogged (CI saw exactly that)
  last=$(newest_ckpt)
  pass "task ${j}_0 stopped after periodic checkpoint $last ($(grep -c "written at step" "$W/c.run/log_0.log") logged)"
else
  fail "no two periodic checkpoints from task ${j}_0 (ranks: '$pids')"; cat "$W/c.run/log_0.log"
fi
wait "$ref_pid" || fail "the reference run failed"
wait_done 150 "$j" || fail "task ${j}_0 still queued after 150 s"
tid=$(scontrol show job "$j" | sed -n 's/^JobId=\([0-9]*\) .*/\1/p' | head -1)
st=$(job_state "$tid")
echo "# task ${j}_0 (job $tid): $st, ExitCode $(job_field "$tid" ExitCode), RunTime $(job_field "$tid" RunTime)"
[ "$st" = TIMEOUT ] && pass "task ${j}_0 ended TIMEOUT at its one-minute limit" || fail "task ${j}_0 ended $st"
if grep -q "exiting (resumable" "$W/c.run/log_0.log"; then
  fail "the killed run still wrote a checkpoint at SIGTERM: this run did not test the hard kill"
fi

# a checkpoint in flight when the ranks stopped (stopped before its rename)
# may still be published in the instant between SIGCONT and SIGKILL: the
# newest on disk now is the one to resume from, and at most one past `last`
on_disk=$(newest_ckpt)
if [ -n "${last:-}" ] && [ -n "$on_disk" ] && [ "$on_disk" -ge "$last" ] && [ "$on_disk" -le $((last + 1)) ]; then
  pass "after the kill the newest checkpoint on disk is $on_disk (stopped after $last)"
else
  fail "after the kill the newest checkpoint on disk is '${on_disk}', stopped after '${last:-?}'"
fi
last="$on_disk"

# the same task submitted again: the same command resumes from the last periodic checkpoint
j2=$("${run_env[@]}" sbatch --parsable --array=0 -o "$W/c.run/log_%a.log" "$PD_SRC/slurm/pipedec.sbatch")
wait_done 120 "$j2" || fail "the resubmitted task $j2 did not finish"
t2=$(scontrol show job "$j2" | sed -n 's/^JobId=\([0-9]*\) .*/\1/p' | head -1)
echo "# resubmitted task ${j2}_0 (job $t2): $(job_state "$t2"), ExitCode $(job_field "$t2" ExitCode)"
resume=$(grep "resuming from $ck/ckpt-" "$W/c.run/log_0.log" || true)
if [ -n "${last:-}" ] && echo "$resume" | grep -q "ckpt-$last "; then
  pass "the resubmitted task resumed from the last periodic checkpoint: ${resume#pipedec: }"
else
  fail "the resubmitted task did not resume from checkpoint ${last:-?}: '$resume'"; tail -20 "$W/c.run/log_0.log"
fi
[ "$(job_state "$t2")" = COMPLETED ] && pass "the resubmitted task COMPLETED" || fail "resubmitted: $(job_state "$t2")"
"$P" merge --pages "$W/c.pages/pages.jsonl" --out-dir "$W/c.run/out" --out "$W/c.merged" >/dev/null 2>"$W/c.merge.err" \
  || fail "merge: $(cat "$W/c.merge.err")"
same "$W/c.ref" "$W/c.merged" "killed at the time limit, resumed from a periodic checkpoint == one uninterrupted run"
finish

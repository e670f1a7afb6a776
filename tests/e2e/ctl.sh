#!/usr/bin/env bash
# The control socket (issue 14): `pipedec run --control PATH` on rank 0 and
# `pipedec ctl PATH ...` — status (human and --json), migrations by map and
# by layer, refusals that change nothing (a bad map, a layer that is not at a
# boundary, checkpoint or stop without --checkpoint-dir, a second migration while
# one waits for its drain point), a client that disconnects mid-command, the
# socket's mode, a path that already exists (a file, a live socket, a stale
# socket), a migration after the model file left its path (the weights come
# over MPI), and checkpoint / stop through the socket. The job that takes
# ~25 steps has more pages than it can finish and is ended by `ctl stop`; the
# others run at batch 1 to outlive their one or two steps. Every out.jsonl is
# byte-identical to a one-rank run throughout.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 12 --hidden 128 --heads 4 --kv-heads 2 --ffn 256 --vocab 320 --seed 8 \
  --out "$m" >/dev/null
# the first job must outlive ~25 ctl steps and three drain points whatever
# the machine's speed: it gets 3000 pages (about a minute on one rank without
# sanitizers), and the test ends it with `ctl stop` once its steps are done,
# then compares the pages it wrote with the reference's first lines. Output
# is in manifest order and a page's bytes depend on nothing else, so the
# first K lines of a reference are the reference of the first K pages: the
# 120-page reference serves every job here (and a longer one is run only if
# the first job wrote more than 120 pages).
"$PIPEDEC" mkpages --model "$m" --count 3000 --embed-rows 12 --prompt-tokens 3 --max-new 200 --seed 6 \
  --out "$T/long" >/dev/null
PA="$T/long/pages.jsonl"
PL="$T/long/first120.jsonl"
P="$T/long/first60.jsonl"
head -n 120 "$PA" > "$PL"
head -n 60 "$PA" > "$P"
head -n 12 "$PA" > "$T/long/first12.jsonl"
MPIRUN=(mpirun --oversubscribe --bind-to none)
CTL=("$PD_BUILD/pipedec" ctl)
"$PIPEDEC" run --model "$m" --pages "$PL" --out "$T/ref_long.jsonl" --batch 4 --digest >/dev/null 2>&1
head -n 60 "$T/ref_long.jsonl" > "$T/ref.jsonl"
head -n 12 "$T/ref_long.jsonl" > "$T/ref12.jsonl"

# start OUT SOCK extra...: a job of $NP ranks (default 2; 0: no mpirun) in
# the background (exit status in OUT.rc) on the 3000 pages of $PA, batch
# $BATCH (default 4), writing its ranks' pids to OUT.pids. It cannot finish
# before the test ends it (ctl stop, or a signal): no step races its end.
start() {
  local out="$1" sock="$2"; shift 2
  local cmd=("$PIPEDEC" run --model "${MODEL:-$m}" --pages "$PA" --out "$out" --batch "${BATCH:-4}" --digest
             --control "$sock" --pid-file "$out.pids" "$@")
  [ "${NP:-2}" -gt 0 ] && cmd=("${MPIRUN[@]}" -np "${NP:-2}" "${cmd[@]}")
  rm -f "$out.rc"
  ( rc=0; timeout 600 "${cmd[@]}" >"$out.log" 2>&1 </dev/null || rc=$?; echo "$rc" > "$out.rc" ) &
  for _ in $(seq 1 6000); do [ -S "$sock" ] && [ -s "$out" ] && [ -s "$out.pids" ] && break; sleep 0.01; done
}
# same_prefix OUT WHAT: OUT (a job on $PA ended midway) holds the first k
# pages of an uninterrupted one-rank run, digests included
same_prefix() {
  local k
  k=$(wc -l < "$1")
  if [ "$k" -gt 120 ]; then
    head -n "$k" "$PA" > "$T/long/firstk.jsonl"
    rm -f "$T/refk.jsonl"
    "$PIPEDEC" run --model "$m" --pages "$T/long/firstk.jsonl" --out "$T/refk.jsonl" --batch 4 --digest >/dev/null 2>&1
  else
    head -n "$k" "$T/ref_long.jsonl" > "$T/refk.jsonl"
  fi
  [ "$k" -ge 1 ] && [ "$k" -lt 3000 ] && pass "$2: the job wrote $k of its 3000 pages before it was ended" \
    || fail "$2: the job wrote $k pages: it should have been ended midway"
  same "$T/refk.jsonl" "$1" "$2: output == one rank"
}
# ctl_ok NAME ARGS...: exit 0; the reply in $T/ctl.out
ctl_ok() {
  local name="$1" rc=0; shift
  timeout 60 "${CTL[@]}" "$@" >"$T/ctl.out" 2>"$T/ctl.err" || rc=$?
  if [ "$rc" -eq 0 ]; then pass "$name"; else fail "$name: exit $rc"; cat "$T/ctl.err" "$T/ctl.out" | head -3; fi
}
# ctl_refused NAME PATTERN ARGS...: exit 1, the reason on stderr matches
ctl_refused() {
  local name="$1" pat="$2" rc=0; shift 2
  timeout 60 "${CTL[@]}" "$@" >"$T/ctl.out" 2>"$T/ctl.err" || rc=$?
  if [ "$rc" -eq 1 ] && grep -Eq -e "$pat" "$T/ctl.err" && grep -q '"ok":false' "$T/ctl.out"; then
    pass "$name: refused ($(head -c 150 "$T/ctl.err"))"
  else
    fail "$name: exit $rc"; cat "$T/ctl.err" "$T/ctl.out" | head -3
  fi
}
jq_get() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

S="$T/job.sock"; out="$T/a.jsonl"
start "$out" "$S" --checkpoint-dir "$T/a.ck"
[ "$(awk '{print $1}' "$out.pids" | tr '\n' ' ')" = "0 1 " ] && [ -n "$(rank_pid "$out" 0)" ] \
  && kill -0 "$(rank_pid "$out" 0)" "$(rank_pid "$out" 1)" && pass "--pid-file names both ranks' live pids" \
  || fail "--pid-file: $(cat "$out.pids" 2>&1)"
[ "$(stat -c %a "$S")" = 600 ] && pass "the socket is mode 0600" || fail "socket mode $(stat -c %a "$S")"

# the socket path exists: a live socket is refused, a file is refused
expect_fail "--control on a live job's socket" "another job is listening on that socket" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/b.jsonl" --control "$S"
touch "$T/file"
expect_fail "--control naming a file" "exists and is not a socket" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/b.jsonl" --control "$T/file"
[ -f "$T/file" ] && [ ! -s "$T/b.jsonl" ] && pass "refused runs left the file and wrote nothing" \
  || fail "a refused run touched its paths"

ctl_ok "status --json" "$S" status --json
if [ "$(jq_get "$T/ctl.out" "j['map'], len(j['stages']), j['ok'], 'busy_s' in j['stages'][0], 'tokens_per_s' in j")" \
     = "('0-5,6-11', 2, True, True, True)" ]; then pass "status --json: map, two stages with busy times, tokens/s"
else fail "status --json: $(head -c 300 "$T/ctl.out")"; fi
d1=$(jq_get "$T/ctl.out" "j['drain_points']")
ctl_ok "status (human)" "$S" status
ctl_ok "status --json again" "$S" status --json
d2=$(jq_get "$T/ctl.out" "j['drain_points']")
[ -n "$d1" ] && [ "$d1" = "$d2" ] && [ "$(jq_get "$T/ctl.out" "j['window_s'] > 0 and j['stages'][1]['busy_s'] >= 0")" = True ] \
  && pass "status costs no drain point ($d1 before and after three status requests)" \
  || fail "status: drain points $d1 -> $d2: $(head -c 300 "$T/ctl.out")"
ctl_ok "status (human)" "$S" status
grep -q "^map: 0-5,6-11$" "$T/ctl.out" && grep -q "^stage 1: layers 6-11, busy" "$T/ctl.out" \
  && pass "status prints key: value lines" || { fail "status text"; head -5 "$T/ctl.out"; }

# 16 clients that connect and send nothing or half a line hold every slot:
# ctl still gets through (the oldest idle one makes room), and they are
# dropped within the line timeout
python3 - "$S" > "$T/jam.out" <<'PY' &
import socket, sys, time
held = []
for i in range(16):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
    if i % 2: s.sendall(b"stat")
    held.append(s)
time.sleep(8)
dropped = 0
for s in held:
    s.settimeout(0.5)
    try:
        reply = s.recv(4096)
    except OSError:
        continue
    # told why, then closed: "dropped: ..." or "no complete request line within 5 s"
    dropped += b'"ok":false' in reply and (b"dropped" in reply or b"no complete request line" in reply)
print(dropped)
PY
jam=$!
sleep 1
ctl_ok "status while 16 silent clients hold every slot" "$S" status --json
wait "$jam"
[ "$(cat "$T/jam.out")" = 16 ] && pass "every silent client was dropped (the oldest for room, the rest after 5 s)" \
  || fail "silent clients: $(cat "$T/jam.out") of 16 dropped"
ctl_refused "a map of the wrong rank count" "refused: .*" "$S" migrate --map 0-11
ctl_refused "a map past the model" "refused: .*" "$S" migrate --map 0-5,6-20
ctl_refused "a layer not at a boundary" "can move only to a neighbour" "$S" migrate --layer 3 --to 1
ctl_refused "the map in force" "in force already" "$S" migrate --map 0-5,6-11
rc=0; "${CTL[@]}" "$S" frobnicate >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 2 ] && pass "an unknown command is a usage error (exit 2)" || fail "unknown command: exit $rc"
ctl_ok "status after the refusals" "$S" status --json
[ "$(jq_get "$T/ctl.out" "j['map'], j['migrations']")" = "('0-5,6-11', 0)" ] \
  && pass "the refusals changed nothing" || fail "after refusals: $(head -c 200 "$T/ctl.out")"

ctl_ok "migrate --layer 5 --to 1" "$S" migrate --layer 5 --to 1
[ "$(jq_get "$T/ctl.out" "j['moved'], j['to'], j['layers']")" = "(True, '0-4,5-11', 1)" ] \
  && pass "the reply says what moved" || fail "migrate reply: $(head -c 300 "$T/ctl.out")"
ctl_ok "migrate --map 0-7,8-11" "$S" migrate --map 0-7,8-11
ctl_ok "status after two migrations" "$S" status --json
[ "$(jq_get "$T/ctl.out" "j['map'], j['migrations']")" = "('0-7,8-11', 2)" ] \
  && pass "status shows the new map" || fail "status after migrations: $(head -c 200 "$T/ctl.out")"

# a second migration while one waits for its drain point: the head is
# stopped, both requests queue in the socket, the first is taken, the second
# refused
head_pid=$(rank_pid "$out" 0)
[ -n "$head_pid" ] || fail "no head pid in $out.pids"
kill -STOP "$head_pid"
( rc=0; timeout 60 "${CTL[@]}" "$S" migrate --map 0-6,7-11 >"$T/m1.out" 2>"$T/m1.err" || rc=$?; echo $rc >"$T/m1.rc" ) &
j1=$!
sleep 0.3
( rc=0; timeout 60 "${CTL[@]}" "$S" migrate --map 0-8,9-11 >"$T/m2.out" 2>"$T/m2.err" || rc=$?; echo $rc >"$T/m2.rc" ) &
j2=$!
sleep 0.3
kill -CONT "$head_pid"
wait "$j1" "$j2" || true
if [ "$(cat "$T/m1.rc")" = 0 ] && [ "$(cat "$T/m2.rc")" = 1 ] && grep -q "in progress already" "$T/m2.err"; then
  pass "a second migration while one is pending is refused; the first went through"
else
  fail "concurrent migrations: rc $(cat "$T/m1.rc") / $(cat "$T/m2.rc")"; cat "$T/m1.err" "$T/m2.err" | head -3
fi

# a client that disconnects mid-command: the command still runs, the job is unhurt
python3 - "$S" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"migrate --map 0-4,5-11\n"); s.close()
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"stat"); s.close()
PY
for _ in $(seq 1 3000); do grep -q -- "0-6,7-11 -> 0-4,5-11" "$out.log" && break; sleep 0.01; done
grep -q "migration (ctl) at step [0-9]*: 0-6,7-11 -> 0-4,5-11" "$out.log" \
  && pass "a client gone before its reply: the migration ran, the job went on" \
  || { fail "client disconnect: no migration to 0-4,5-11"; grep "migration" "$out.log" | tail -2; }

ctl_ok "stop the long job" "$S" stop
wait
[ "$(cat "$out.rc")" = 75 ] && pass "stopped by ctl: the job checkpointed and exited 75" \
  || { fail "the job exited $(cat "$out.rc")"; tail -3 "$out.log"; }
[ ! -e "$S" ] && pass "the socket is removed at exit" || fail "the socket is left behind"
[ ! -e "$out.pids" ] && pass "the pid file is removed at exit" || fail "the pid file is left behind"
same_prefix "$out" "after ctl migrations"
rc=0; "${CTL[@]}" "$S" status >/dev/null 2>"$T/gone.err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "cannot connect" "$T/gone.err" && pass "ctl with no job listening: exit 2, says so" \
  || fail "ctl with no job: exit $rc"

# the model file is gone from its path while the job runs (the ranks keep
# their mappings): a migration takes the weights over MPI by itself
cp "$m" "$T/mv.gguf"
S3="$T/mv.sock"; out="$T/mv.jsonl"
MODEL="$T/mv.gguf" start "$out" "$S3" --checkpoint-dir "$T/mv.ck"
mv "$T/mv.gguf" "$T/mv.gone"
ctl_ok "migrate with the model file gone" "$S3" migrate --map 0-3,4-11
[ "$(jq_get "$T/ctl.out" "j['moved']")" = "True" ] && grep -q "weights over MPI [0-9]* bytes" "$out.log" \
  && pass "the file unreadable here: the weights came over MPI" \
  || { fail "model file gone: $(head -c 200 "$T/ctl.out")"; grep -i "migrat" "$out.log" | tail -2; }
ctl_ok "stop the job whose model file is gone" "$S3" stop
wait
[ "$(cat "$out.rc")" = 75 ] || { fail "model file gone: the job exited $(cat "$out.rc")"; tail -3 "$out.log"; }
same_prefix "$out" "model file gone, weights over MPI"

# a stale socket (its job died) is replaced
python3 -c "import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])" "$T/stale.sock"
[ -S "$T/stale.sock" ] || fail "could not make a stale socket"
"$PIPEDEC" run --model "$m" --pages "$T/long/first12.jsonl" --out "$T/stale.jsonl" --batch 4 --digest \
  --control "$T/stale.sock" >"$T/stale.log" 2>&1 && pass "a stale socket at the path is replaced" \
  || { fail "stale socket"; tail -2 "$T/stale.log"; }
same "$T/ref12.jsonl" "$T/stale.jsonl" "one rank with --control: output == without"

# checkpoint and stop need --checkpoint-dir: on a one-rank job without one
# both are refused and the job goes on (then SIGINT ends it at once, 130)
S4="$T/nock.sock"; out="$T/nock.jsonl"
NP=0 start "$out" "$S4"
ctl_refused "checkpoint without --checkpoint-dir" "checkpoint needs a job started with --checkpoint-dir" "$S4" checkpoint
ctl_refused "stop without --checkpoint-dir" "stop needs a job started with --checkpoint-dir" "$S4" stop
ctl_ok "status after both refusals" "$S4" status --json
[ "$(jq_get "$T/ctl.out" "j['ok'], j['map']")" = "(True, '0-11')" ] && pass "the job without --checkpoint-dir goes on" \
  || fail "after the refusals: $(head -c 200 "$T/ctl.out")"
kill -INT "$(rank_pid "$out" 0)" 2>/dev/null || fail "no pid for the one-rank job"
wait
[ "$(cat "$out.rc")" = 130 ] && pass "SIGINT: the job exited 130 at once" || fail "SIGINT: exit $(cat "$out.rc")"

# checkpoint and stop through the socket, then resume (at batch 4: the
# batch is not a token-affecting setting) and stop again
S2="$T/ck.sock"; out="$T/ck.jsonl"
BATCH=1 start "$out" "$S2" --checkpoint-dir "$T/ck.d"
ctl_ok "checkpoint" "$S2" checkpoint
grep -q '"checkpoint":".*ckpt-1"' "$T/ctl.out" && [ -d "$T/ck.d/ckpt-1" ] && pass "checkpoint: ckpt-1 written" \
  || fail "checkpoint reply: $(head -c 200 "$T/ctl.out")"
ctl_ok "stop" "$S2" stop
grep -q '"stopping":true' "$T/ctl.out" && pass "stop: checkpointed, stopping" || fail "stop reply: $(head -c 200 "$T/ctl.out")"
wait
[ "$(cat "$out.rc")" = 75 ] && pass "stop: the job exited 75 (resumable)" || fail "stop: exit $(cat "$out.rc")"
k=$(wc -l < "$out")
start "$out" "$S2" --checkpoint-dir "$T/ck.d"
grep -q "resuming from $T/ck.d/ckpt-2" "$out.log" && pass "the rerun resumed from ckpt-2" \
  || { fail "the rerun did not resume"; head -3 "$out.log"; }
for _ in $(seq 1 6000); do [ "$(wc -l < "$out")" -gt "$((k + 2))" ] && break; sleep 0.01; done
ctl_ok "stop the resumed job" "$S2" stop
wait
[ "$(cat "$out.rc")" = 75 ] || fail "the resumed job exited $(cat "$out.rc")"
same_prefix "$out" "stopped by ctl, resumed, stopped"
finish

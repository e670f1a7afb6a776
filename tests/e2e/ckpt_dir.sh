#!/usr/bin/env bash
# A --checkpoint-dir shared with its user (issue 41): links named like
# checkpoints or their temporaries are never followed (their targets keep
# every file), foreign and non-canonical names never decide what is
# resumed, numbered or removed, a number that would wrap is refused, stale
# temporaries of pipedec's own are cleaned while foreign ones stay, and a D
# that is a file or cannot be written stops the job before it decodes
# (as root and as an unprivileged user, where permissions bite).
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 8 \
  --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 24 --embed-rows 12 --prompt-tokens 3 --max-new 200 --seed 6 \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
# a long job: still decoding when the test ends it
"$PIPEDEC" mkpages --model "$m" --count 3000 --embed-rows 12 --prompt-tokens 3 --max-new 300 --seed 6 \
  --out "$T/long" >/dev/null
PA="$T/long/pages.jsonl"
MPIRUN=(mpirun --oversubscribe --bind-to none)
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/ref.jsonl" --batch 3 --digest >/dev/null 2>&1

# user data the links point at
mkfiles() { mkdir -p "$1"; for f in a b c; do echo "keep $f" > "$1/$f.txt"; done; }
intact() { # intact DIR WHAT
  if [ "$(cat "$1"/*.txt 2>/dev/null | tr '\n' ' ')" = "keep a keep b keep c " ]; then pass "$2"; else
    fail "$2: $(ls -la "$1" 2>&1 | tr '\n' ' ')"; fi
}

# hostile D: ckpt-1 and ckpt-3 links to user data, the old temporary name
# of checkpoint 2 a link, a file named ckpt-2, non-canonical names, and a
# real directory ckpt-4 of the user's (no manifest)
D="$T/hostile.d"; mkdir -p "$D"
mkfiles "$T/results"; mkfiles "$T/other"; mkfiles "$T/user4"; mkfiles "$T/odd"
ln -s "$T/results" "$D/ckpt-1"; ln -s "$T/results" "$D/ckpt-3"; ln -s "$T/other" "$D/.ckpt-2.tmp"
ln -s "$T/other" "$D/.ckpt-5.tmp"
echo "not a checkpoint" > "$D/ckpt-2"
cp -r "$T/user4" "$D/ckpt-4"
cp -r "$T/odd" "$D/ckpt--1"; cp -r "$T/odd" "$D/ckpt-007"
# a job that checkpoints every second (several times: the keep-the-last-two
# cleanup runs), then SIGUSR2 at the third
out="$T/h.jsonl"
( rc=0; timeout 300 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$PA" --out "$out" --batch 3 --digest \
    --checkpoint-dir "$D" --checkpoint-every 1 >"$out.log" 2>&1 </dev/null || rc=$?; echo "$rc" > "$out.rc" ) &
job=$!
for _ in $(seq 1 6000); do [ "$(grep -c 'written at step' "$out.log" 2>/dev/null)" -ge 4 ] && break; sleep 0.01; done
kill -USR2 "$(pgrep -f -o "^mpirun.*--out $out " || echo 0)" 2>/dev/null || true
wait "$job" || true
n_ck=$(grep -c "written at step" "$out.log" || true)
[ "$(cat "$out.rc")" -eq 75 ] && [ "$n_ck" -ge 4 ] && pass "hostile D: $n_ck checkpoints written, exit 75" \
  || { fail "hostile D: exit $(cat "$out.rc"), $n_ck checkpoints"; grep -i checkpoint "$out.log" | head -5; }
intact "$T/results" "a link named ckpt-1/ckpt-3: its target keeps every file"
intact "$T/other" "a link named like a temporary (.ckpt-2.tmp): its target keeps every file"
intact "$D/ckpt-4" "the user's own directory ckpt-4 (no manifest) is left as it is"
intact "$D/ckpt--1" "a non-canonical name (ckpt--1) is left as it is"
intact "$D/ckpt-007" "a non-canonical name (ckpt-007) is left as it is"
[ -L "$D/ckpt-1" ] && [ -L "$D/ckpt-3" ] && [ -L "$D/.ckpt-2.tmp" ] && [ "$(cat "$D/ckpt-2")" = "not a checkpoint" ] \
  && pass "the links and the file ckpt-2 themselves are still there" || fail "a foreign entry was removed"
grep -q "ignoring ckpt-1 (a symbolic link)" "$out.log" && grep -q "ignoring ckpt-2 (a regular file)" "$out.log" \
  && grep -q "ignoring ckpt--1 (not a canonical" "$out.log" \
  && pass "the foreign entries are named on stderr" || { fail "no message on foreign entries"; head -5 "$out.log"; }
# numbered past every canonical name (the highest is 4): 5, 6, ...; two kept
mine=$(cd "$D" && for x in ckpt-*; do [ -d "$x" ] && [ ! -L "$x" ] && [ -f "$x/manifest.pdck" ] && echo "$x"; done | sort -V | tr '\n' ' ')
last=$((4 + n_ck))
[ "$mine" = "ckpt-$((last - 1)) ckpt-$last " ] && pass "checkpoints numbered past ckpt-4; the last two kept ($mine)" \
  || fail "checkpoints kept: '$mine', expected ckpt-$((last - 1)) ckpt-$last"
[ -z "$(ls -A "$D" | grep '^\.ckpt-[0-9]*\.[A-Za-z0-9]\{6\}$')" ] && pass "no temporary directory left" \
  || fail "temporaries left: $(ls -A "$D" | tr '\n' ' ')"
# resume from it: skips ckpt-4 (unusable) only if it is newer; the newest
# is pipedec's own; the output equals an uninterrupted run's first lines
k=$(wc -l < "$out")
head -n "$k" "$PA" > "$T/long/first.jsonl"
timeout 300 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$PA" --out "$out" --batch 3 --digest \
    --checkpoint-dir "$D" >"$out.resume.log" 2>&1 </dev/null &
job=$!
for _ in $(seq 1 3000); do [ "$(wc -l < "$out")" -gt "$((k + 2))" ] && break; sleep 0.01; done
kill -USR2 "$(pgrep -f -o "^mpirun.*--out $out " || echo 0)" 2>/dev/null || true
wait "$job" || true
grep -q "resuming from $D/ckpt-$last" "$out.resume.log" && pass "resumed from pipedec's newest checkpoint (ckpt-$last)" \
  || { fail "resume in the hostile D"; head -5 "$out.resume.log"; }
k=$(wc -l < "$out")
head -n "$k" "$PA" > "$T/long/first.jsonl"
"$PIPEDEC" run --model "$m" --pages "$T/long/first.jsonl" --out "$T/first.ref" --batch 3 --digest >/dev/null 2>&1
same "$T/first.ref" "$out" "hostile D: stopped, resumed, stopped: output == uninterrupted ($k pages)"
intact "$T/results" "after the resume, the links' targets still keep every file"

# stale temporaries: pipedec's own (only its file names, bundle magic) are
# removed at start-up; one holding a user's file is left and named
D="$T/stale.d"; mkdir -p "$D/.ckpt-7.Ab3dEf" "$D/.ckpt-8.tmp" "$D/.ckpt-9.qqqqqq"
printf 'CMFB\2\0\0\0' > "$D/.ckpt-7.Ab3dEf/layer-00000.cmfb"
printf 'CMFB\2\0\0\0' > "$D/.ckpt-8.tmp/layer-00001.cmfb"
echo "mine" > "$D/.ckpt-9.qqqqqq/notes.txt"
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/stale.jsonl" --batch 3 --digest --checkpoint-dir "$D" \
  >/dev/null 2>"$T/stale.err" || fail "stale temporaries: exit $?"
[ ! -e "$D/.ckpt-7.Ab3dEf" ] && [ ! -e "$D/.ckpt-8.tmp" ] && [ "$(cat "$D/.ckpt-9.qqqqqq/notes.txt")" = mine ] \
  && grep -q "holds notes.txt, which pipedec did not write there" "$T/stale.err" \
  && pass "stale temporaries: pipedec's removed, the one with a user's file left and named" \
  || { fail "stale temporaries: $(ls -A "$D" | tr '\n' ' ')"; head -5 "$T/stale.err"; }
same "$T/ref.jsonl" "$T/stale.jsonl" "stale temporaries: output == uninterrupted"

# numbers that would wrap are refused before anything is decoded
D="$T/wrap.d"; mkdir -p "$D/ckpt-18446744073709551615"
expect_fail "ckpt-18446744073709551615 leaves no next number" "ckpt-18446744073709551615 leaves no number" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/wrap.jsonl" --checkpoint-dir "$D"
[ ! -e "$T/wrap.jsonl" ] && pass "wrap: no output written" || fail "wrap: an output was written"
# a number past 2^64 is not canonical: ignored, numbering starts at 1
D="$T/big.d"; mkdir -p "$D/ckpt-18446744073709551616"
"$PIPEDEC" run --model "$m" --pages "$PA" --out "$T/big.jsonl" --batch 3 --digest --checkpoint-dir "$D" \
  >/dev/null 2>"$T/big.err" &
job=$!
for _ in $(seq 1 3000); do [ -s "$T/big.jsonl" ] && break; sleep 0.01; done
kill -USR2 "$(pgrep -f -n "^$PIPEDEC_BIN.*--out $T/big.jsonl " || echo 0)" 2>/dev/null || true
wait "$job" || true
[ -d "$D/ckpt-1" ] && [ -d "$D/ckpt-18446744073709551616" ] && pass "a 21-digit name is ignored; the first checkpoint is ckpt-1" \
  || { fail "21-digit name: $(ls "$D" | tr '\n' ' ')"; tail -3 "$T/big.err"; }

# the output deleted before a resume: said plainly, nothing decoded
rm -f "$T/big.jsonl"
expect_fail "resume with the output deleted" "big.jsonl: does not exist, but checkpoint 1 recorded [0-9]+ bytes" \
  "$PIPEDEC" run --model "$m" --pages "$PA" --out "$T/big.jsonl" --batch 3 --digest --checkpoint-dir "$D"

# D is a file, or under a file: refused at start-up on every rank count
echo "x" > "$T/afile"
for n in 0 2; do
  cmd=("$PIPEDEC" run --model "$m" --pages "$P" --out "$T/file$n.jsonl" --checkpoint-dir "$T/afile")
  [ "$n" -gt 0 ] && cmd=("${MPIRUN[@]}" -np "$n" "${cmd[@]}")
  expect_fail "--checkpoint-dir is a regular file (${n} ranks)" "checkpoint-dir .*afile: is a regular file, not a directory" \
    "${cmd[@]}"
  [ ! -e "$T/file$n.jsonl" ] && pass "a file as D: nothing decoded ($n ranks)" || fail "a file as D: output written"
done
expect_fail "--checkpoint-dir under a file" "afile/d: Not a directory" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/under.jsonl" --checkpoint-dir "$T/afile/d"
# a D created when absent
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/new.jsonl" --batch 3 --digest --checkpoint-dir "$T/newd" \
  >/dev/null 2>&1 && [ -d "$T/newd" ] && [ -z "$(ls -A "$T/newd")" ] && pass "an absent D is created (and left empty)" \
  || fail "an absent D"

# --pid-file where it cannot be written: refused before anything is decoded
expect_fail "--pid-file in a directory that does not exist" "pid-file: .*nodir/p.pids" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/pid.jsonl" --pid-file "$T/nodir/p.pids"
[ ! -e "$T/pid.jsonl" ] && pass "an unwritable --pid-file: nothing decoded" || fail "an unwritable --pid-file: output written"

# permissions bite only for a user who is not root: a world-readable copy
# of the inputs, D owned by root and not writable by nobody
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null && id nobody >/dev/null 2>&1; then
  U="$T/nobody"; mkdir -p "$U/ro"; chmod 755 "$T" "$U"; chmod 755 "$U/ro"
  cp "$m" "$U/m.gguf"; cp -r "$T/pages" "$U/pages"; chmod -R a+rX "$U"; mkdir -p "$U/out"; chmod 777 "$U/out"
  # a pipedec built with llama.cpp (image pages) loads its libraries from
  # where scripts/llama_cpp.sh installed them, under root's home: nobody
  # cannot read there, so those libraries get a world-readable copy
  # (LD_LIBRARY_PATH comes before the binary's RUNPATH)
  libs=$(ldd "$PD_BUILD/pipedec" | awk '$3 ~ /^\// { print $3 }' | grep "^$HOME/" || true)
  if [ -n "$libs" ]; then
    mkdir -p "$U/lib"
    # shellcheck disable=SC2086
    cp -L $libs "$U/lib/"
    chmod -R a+rX "$U/lib"
  fi
  expect_fail "--checkpoint-dir not writable (as nobody)" "checkpoint-dir .*ro: cannot write there: Permission denied" \
    setpriv --reuid=nobody --regid=nogroup --clear-groups env TMPDIR="$U/out" LD_LIBRARY_PATH="$U/lib" "$PD_BUILD/pipedec" run \
      --model "$U/m.gguf" --pages "$U/pages/pages.jsonl" --out "$U/out/o.jsonl" --checkpoint-dir "$U/ro"
  [ ! -e "$U/out/o.jsonl" ] && pass "an unwritable D: nothing decoded" || fail "an unwritable D: output written"
  expect_fail "--checkpoint-dir that cannot be created (as nobody)" "ro/sub: cannot create it: Permission denied" \
    setpriv --reuid=nobody --regid=nogroup --clear-groups env TMPDIR="$U/out" LD_LIBRARY_PATH="$U/lib" "$PD_BUILD/pipedec" run \
      --model "$U/m.gguf" --pages "$U/pages/pages.jsonl" --out "$U/out/o.jsonl" --checkpoint-dir "$U/ro/sub"
else
  fail "the permission cases need root, setpriv and the user nobody"
fi
finish

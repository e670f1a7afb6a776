#!/usr/bin/env bash
# Checkpoint benchmark (issue 13): checkpoint write bandwidth against the
# disk's fsync write bandwidth measured in the same run (goal >= 0.5), the
# decode pause of one checkpoint against one decode step, and the time to
# restore a checkpoint against re-prefilling the same streams from scratch.
# Prints one JSON object.
# usage: bench/checkpoint.sh BUILD_DIR [WORK_DIR]
set -euo pipefail
build="${1:?usage: bench/checkpoint.sh BUILD_DIR [WORK_DIR]}"
work="${2:-$(mktemp -d "${TMPDIR:-/tmp}/pd-bench-ckpt.XXXXXX")}"
P="$build/pipedec"
mkdir -p "$work"
trap 'rm -rf "$work/D" "$work/probe"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
now() { date +%s.%N; }

# the disk: 256 MiB written and fsynced, where checkpoints go
t0=$(now); dd if=/dev/zero of="$work/probe" bs=1M count=256 conv=fsync status=none; t1=$(now)
disk=$(python3 -c "print(256 * 2**20 / ($t1 - $t0))")

m="$work/m.gguf"
[ -f "$m" ] || "$P" mkmodel --arch llama --layers 8 --hidden 512 --heads 8 --kv-heads 8 --ffn 1536 --vocab 8000 \
  --seed 5 --out "$m" >/dev/null
[ -d "$work/pages" ] || "$P" mkpages --model "$m" --count 16 --embed-rows 277 --prompt-tokens 3 --max-new 64 \
  --seed 4 --out "$work/pages" >/dev/null
[ -d "$work/pre" ] || "$P" mkpages --model "$m" --count 16 --embed-rows 277 --prompt-tokens 3 --max-new 1 \
  --seed 4 --out "$work/pre" >/dev/null

# one checkpoint, on SIGUSR1 once the first page is out (every stream decoding)
rm -rf "$work/D" "$work/a.jsonl"
"$P" run --model "$m" --pages "$work/pages/pages.jsonl" --out "$work/a.jsonl" --batch 16 --checkpoint-dir "$work/D" \
  --stats "$work/a.stats" >/dev/null 2>"$work/a.log" &
job=$!
for _ in $(seq 1 6000); do [ -s "$work/a.jsonl" ] && break; sleep 0.01; done
kill -USR1 "$job"
wait "$job"
ck_s=$(sed -n 's/.*written at step [0-9]* in \([0-9.]*\) s.*/\1/p' "$work/a.log" | head -1)
ck_bytes=$(du -sb "$work/D/ckpt-1" | cut -f1)

# restore it (a rerun that resumes) against re-prefilling the same streams
rm -f "$work/b.jsonl"; head -c "$(python3 -c "
import struct,sys
b=open('$work/D/ckpt-1/manifest.pdck','rb').read(); print(struct.unpack_from('<Q', b, 32)[0])")" "$work/a.jsonl" > "$work/b.jsonl"
"$P" run --model "$m" --pages "$work/pages/pages.jsonl" --out "$work/b.jsonl" --batch 16 --checkpoint-dir "$work/D" \
  >/dev/null 2>"$work/b.log"
restore_s=$(sed -n 's/.*restored checkpoint [0-9]* in \([0-9.]*\) s.*/\1/p' "$work/b.log" | head -1)
streams=$("$P" inspect "$work/D/ckpt-1" | sed -n 's/^streams: //p')
rm -f "$work/p.jsonl"
"$P" run --model "$m" --pages "$work/pre/pages.jsonl" --out "$work/p.jsonl" --batch 16 --stats "$work/p.stats" \
  >/dev/null 2>&1
cmp -s "$work/a.jsonl" "$work/b.jsonl" && identical=true || identical=false

python3 - "$work/a.stats" "$work/p.stats" <<PY
import json, sys
a = json.load(open(sys.argv[1])); p = json.load(open(sys.argv[2]))
step = a["wall_s"] / a["stages"][0]["micro_batches"]
prefill_per_stream = p["wall_s"] / p["pages_done"]
reprefill = prefill_per_stream * $streams
out = {
  "disk_fsync_write_Bps": $disk,
  "checkpoint_bytes": $ck_bytes,
  "checkpoint_write_s": $ck_s,
  "checkpoint_write_Bps": $ck_bytes / $ck_s,
  "checkpoint_over_disk": ($ck_bytes / $ck_s) / $disk,
  "decode_step_s": step,
  "pause_over_decode_step": $ck_s / step,
  "streams_restored": $streams,
  "restore_s": $restore_s,
  "reprefill_s": reprefill,
  "restore_over_reprefill": $restore_s / reprefill,
  "resumed_output_identical": "$identical" == "true",
}
print(json.dumps(out, indent=1))
PY

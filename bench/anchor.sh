#!/usr/bin/env bash
# Anchor benchmark (issue 17): pipedec as a user runs it, against llama.cpp
# on the same GGUF files in the same interleaved run when a local llama.cpp
# checkout is given, else against the machine's limits measured in the run.
#
# The model is built here with `pipedec mkmodel`: --arch llama (the default)
# is the OCR-shaped dense decoder (12 layers, hidden 1280, 10 x 128 heads, ffn
# 6848, vocab 32000); --arch deepseek2-ocr is DeepSeek-OCR's decoder itself
# (12 layers, hidden 1280, 10 x 128 heads, a dense first layer of ffn 6848,
# then 64 routed experts of ffn 896, top 6, plus 2 shared; vocab 129280).
# Weight types (--dtypes): f32, f16, bf16, q8_0, q4_0, q5_0, q4_k, q5_k, q6_k
# as mkmodel writes them, and the mixes users download, q4_k_m and q5_k_m
# (llama.cpp's llama-quantize Q4_K_M / Q5_K_M of the f16 file: needs
# llama.cpp, below). Pages from `pipedec mkpages`:
# 277 prefill rows (BOS + 276 prompt tokens, so llama.cpp reads the same rows)
# and 64 new tokens each.
# Workloads, decode always separated from prefill on both sides:
#   prefill rows/s: 1 stream (llama-bench pp277) and 64 streams
#     (llama-batched-bench S_PP at 64);
#   decode tokens/s at 1, 8, 32 and 64 streams (pipedec: `--stats` decode
#     tokens_per_s of a run with --batch N over N pages; llama.cpp:
#     llama-batched-bench S_TG at pl = N, batch 1 also llama-bench tg64);
#   peak RSS (/usr/bin/time -v) of each run.
# Every (workload, engine) runs `reps` times, interleaved (rep 1 of every
# workload and engine, then rep 2, ...), and counts by its median.
# Limits measured in the same run (bench_probe, bench_gemm): read bandwidth
# BW at T threads (the best of a probe before the runs and one after each
# repetition: the host's bandwidth drifts by 15 % and more within minutes)
# and the best f32 GEMM rate of one thread (invariant kernel or OpenBLAS,
# M = 256) times T, F, which bounds T threads from above. A
# token passes two phases one after the other, each bound by the slower of
# its compute and its reads (a roofline per phase; the phases do not overlap):
#   matrices:  max(2 x params / F, matrix bytes / BW) per step of N streams,
#              params the active ones of a token (a mixture of experts: the
#              dense parts, the router, top-k routed and the shared experts),
#              matrix bytes those a step reads, from the file's own tensor
#              types (the embedding table not counted: one row a token; a
#              mixture of experts: each layer's dense parts plus the experts
#              N streams touch, E x (1 - (1 - k/E)^N) in expectation under
#              uniform routing); F is the f32 GEMM rate for every type (the
#              quantized types compute in f32 after exact dequantization),
#              except under --gemm int8, where Q8_0 and the block types
#              multiply in int8 and F is T x bench_probe's vpdpbusd peak
#              (one thread; the best of the same probes as BW);
#   attention: max(4 x L x heads x head_dim x ctx / F, KV bytes / BW), the K
#              and V rows of every layer read once per token at a mid-decode
#              context ctx = P + new/2 (prefill: the mean prefix, P/2);
#   limit tokens/s (or prefill rows/s) = 1 / (matrices + attention).
# Batch 1 is also given against the bandwidth of its own seconds
# (decode_1_vs_adjacent_probe): bytes read per second (weights, and weights
# plus K/V) over the better of a probe just before and one just after each
# run, the median over repetitions.
# pipedec runs as 1 rank x T threads (`--threads T`), llama.cpp with -t T.
#
# llama.cpp is never vendored or downloaded: set LLAMA_CPP_PREFIX to an
# installed llama.cpp (e.g. LLAMA_CPP_PREFIX=$(scripts/llama_cpp.sh), the
# pinned node-llama-cpp bundle the tests build: llama-batched-bench and
# llama-quantize; without llama-bench, the 1-stream figures come from
# llama-batched-bench at 1 stream), or LLAMA_CPP_DIR to a local checkout and
# llama-bench, llama-batched-bench and llama-quantize are built there with
# cmake (build dir LLAMA_CPP_BUILD, default $LLAMA_CPP_DIR/build-pipedec-anchor).
# Times on a shared machine are noisy: read the medians and the ratios.
#
# usage: bench/anchor.sh BUILD_DIR [--quick] [--reps N] [--threads T] [--work DIR]
#                        [--arch llama|deepseek2-ocr] [--dtypes f32,f16,q8_0]
#   --quick: a small model (2 layers, hidden 128; deepseek2-ocr: 8 experts of
#            64, top 2, 1 shared) and short pages (33 rows, 8 new tokens), to
#            check the script end to end in a minute or two
#   --work DIR: keep models, pages and raw outputs in DIR (default: a
#            temporary directory, removed at exit)
#   --dtypes LIST: weight types to measure (default f32,f16,q8_0); each adds
#            about a quarter hour with llama.cpp
#   --gemm G: pipedec's arithmetic, invariant (default) or int8 (`run
#            --gemm int8`: integer block sums for the quantized types); the
#            JSON's "pipedec_gemm" says which
set -euo pipefail
usage="usage: bench/anchor.sh BUILD_DIR [--quick] [--reps N] [--threads T] [--work DIR] [--arch A] [--dtypes LIST] [--gemm G]"
build="${1:?$usage}"
shift
quick=0
reps=3
threads="$(nproc)"
work=""
dtypes="f32,f16,q8_0"
arch=llama
gemm=invariant
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=1 ;;
    --reps) reps="${2:?$usage}"; shift ;;
    --threads) threads="${2:?$usage}"; shift ;;
    --work) work="${2:?$usage}"; shift ;;
    --dtypes) dtypes="${2:?$usage}"; shift ;;
    --arch) arch="${2:?$usage}"; shift ;;
    --gemm) gemm="${2:?$usage}"; shift ;;
    *) echo "anchor.sh: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
  shift
done
case "$gemm" in invariant|int8) ;; *) echo "anchor.sh: --gemm '$gemm': expected invariant or int8" >&2; exit 2 ;; esac
bin="$build/pipedec"
for x in "$bin" "$build/bench/bench_probe" "$build/bench/bench_gemm"; do
  [ -x "$x" ] || { echo "anchor.sh: $x is missing: build pipedec and its benchmarks first (scripts/build.sh)" >&2; exit 2; }
done
[ -x /usr/bin/time ] || { echo "anchor.sh: /usr/bin/time is missing (peak RSS); install GNU time" >&2; exit 2; }
if [ -z "$work" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
else
  mkdir -p "$work"
fi

llama_bin=""
if [ -n "${LLAMA_CPP_PREFIX:-}" ]; then
  llama_bin="$LLAMA_CPP_PREFIX/bin"
  [ -x "$llama_bin/llama-batched-bench" ] \
    || { echo "anchor.sh: LLAMA_CPP_PREFIX=$LLAMA_CPP_PREFIX has no bin/llama-batched-bench" >&2; exit 2; }
  export LD_LIBRARY_PATH="$LLAMA_CPP_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
elif [ -n "${LLAMA_CPP_DIR:-}" ]; then
  [ -f "$LLAMA_CPP_DIR/CMakeLists.txt" ] \
    || { echo "anchor.sh: LLAMA_CPP_DIR=$LLAMA_CPP_DIR is not a llama.cpp checkout (no CMakeLists.txt)" >&2; exit 2; }
  lb="${LLAMA_CPP_BUILD:-$LLAMA_CPP_DIR/build-pipedec-anchor}"
  echo "anchor.sh: building llama-bench and llama-batched-bench in $lb" >&2
  cmake -S "$LLAMA_CPP_DIR" -B "$lb" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF >&2
  cmake --build "$lb" -j 2 --target llama-bench llama-batched-bench llama-quantize >&2
  llama_bin="$lb/bin"
  for x in llama-bench llama-batched-bench llama-quantize; do
    [ -x "$llama_bin/$x" ] || { echo "anchor.sh: $llama_bin/$x was not built" >&2; exit 2; }
  done
fi

case "$arch:$quick" in
  llama:1) shape=(--layers 2 --hidden 128 --heads 2 --kv-heads 2 --ffn 256 --vocab 1024) ;;
  llama:0) shape=(--layers 12 --hidden 1280 --heads 10 --kv-heads 10 --ffn 6848 --vocab 32000) ;;
  deepseek2-ocr:1) shape=(--layers 2 --hidden 128 --heads 2 --kv-heads 2 --ffn 256 --vocab 1024 --dense-layers 1
                          --experts 8 --experts-used 2 --expert-ffn 64 --shared 1) ;;
  deepseek2-ocr:0) shape=(--layers 12 --hidden 1280 --heads 10 --kv-heads 10 --ffn 6848 --vocab 129280
                          --dense-layers 1 --experts 64 --experts-used 6 --expert-ffn 896 --shared 2) ;;
  *) echo "anchor.sh: --arch '$arch': expected llama or deepseek2-ocr" >&2; exit 2 ;;
esac
if [ "$quick" = 1 ]; then prefill=33; new=8; else prefill=277; new=64; fi
echo "anchor.sh: building models and pages in $work" >&2
mk() { # mk DTYPE: the model of that type, once
  [ -s "$work/m.$1.gguf" ] || "$bin" mkmodel --arch "$arch" "${shape[@]}" --ctx 4096 --dtype "$1" --seed 17 \
    --out "$work/m.$1.gguf" >/dev/null
}
for dt in ${dtypes//,/ }; do
  case "$dt" in
    f32|f16|bf16|q8_0|q4_0|q5_0|q4_k|q5_k|q6_k) mk "$dt" ;;
    q4_k_m|q5_k_m)
      [ -x "$llama_bin/llama-quantize" ] \
        || { echo "anchor.sh: --dtypes $dt is made by llama.cpp's llama-quantize: set LLAMA_CPP_PREFIX or LLAMA_CPP_DIR" >&2; exit 2; }
      mk f16
      [ -s "$work/m.$dt.gguf" ] || "$llama_bin/llama-quantize" "$work/m.f16.gguf" "$work/m.$dt.gguf" "${dt^^}" 2 \
        >"$work/quantize.$dt.log" 2>&1 || { echo "anchor.sh: llama-quantize $dt failed: see $work/quantize.$dt.log" >&2; exit 2; } ;;
    *) echo "anchor.sh: --dtypes: '$dt' is not one of f32 f16 bf16 q8_0 q4_0 q5_0 q4_k q5_k q6_k q4_k_m q5_k_m" >&2; exit 2 ;;
  esac
done
"$bin" mkpages --model "$work/m.${dtypes%%,*}.gguf" --count 64 --embed-rows 0 --prompt-tokens $((prefill - 1)) \
  --max-new "$new" --seed 17 --out "$work/pages" >/dev/null

echo "anchor.sh: measuring limits" >&2
"$build/bench/bench_probe" "$threads" 3 > "$work/probe.json"
"$build/bench/bench_gemm" 1 > "$work/gemm.json"

ANCHOR_GEMM="$gemm" ANCHOR_PROBE="$build/bench/bench_probe" python3 - "$bin" "$work" "$reps" "$threads" "$quick" "$prefill" "$new" "$llama_bin" "$dtypes" "${shape[@]}" <<'PY'
import json, math, os, re, statistics, struct, subprocess, sys

bin_, work, reps, T, quick, P, NEW, llama, dtypes = sys.argv[1:10]
reps, T, quick, P, NEW = int(reps), int(T), quick == "1", int(P), int(NEW)
shape = dict(zip(sys.argv[10::2], map(int, sys.argv[11::2])))
streams = [1, 8, 32, 64]
dtypes = dtypes.split(",")
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

lines = open(f"{work}/pages/pages.jsonl").read().splitlines(keepends=True)
for n in streams:
    open(f"{work}/pages/n{n}.jsonl", "w").writelines(lines[:n])

# ggml type -> (elements, bytes) of a block
GG_BLOCK = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
            10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210)}

def gguf_info(path):
    """The scalar metadata and (name, ne, bytes) of every tensor of a GGUF v3 file."""
    f = open(path, "rb")
    magic, _, n_t, n_kv = struct.unpack("<4sIQQ", f.read(24))
    assert magic == b"GGUF", path
    size = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    fmt = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    def rstr():
        return f.read(struct.unpack("<Q", f.read(8))[0]).decode("utf-8", "replace")
    def rval(t):
        if t == 8:
            return rstr()
        if t == 9:  # arrays are skipped
            et, n = struct.unpack("<IQ", f.read(12))
            if et == 8:
                for _ in range(n):
                    f.seek(struct.unpack("<Q", f.read(8))[0], 1)
            else:
                f.seek(size[et] * n, 1)
            return None
        return struct.unpack("<" + fmt[t], f.read(size[t]))[0]
    kv = {}
    for _ in range(n_kv):
        k = rstr()
        kv[k] = rval(struct.unpack("<I", f.read(4))[0])
    tensors = []
    for _ in range(n_t):
        name = rstr()
        nd = struct.unpack("<I", f.read(4))[0]
        ne = struct.unpack("<%dQ" % nd, f.read(8 * nd))
        typ, _ = struct.unpack("<IQ", f.read(12))
        be, bb = GG_BLOCK[typ]
        tensors.append((name, ne, math.prod(ne) // be * bb))
    return kv, tensors

def model_cost(path):
    """What a token and a step of N streams cost on this file: active params
    per token, the matrix bytes a step of N streams reads, the attention
    shape. A mixture of experts: every layer's dense parts, the top-k of E
    experts per token, and E x (1 - (1 - k/E)^N) experts a step in
    expectation (uniform routing)."""
    kv, ts = gguf_info(path)
    a = kv["general.architecture"]
    g = lambda k, d=None: kv.get(f"{a}.{k}", d)
    E, k = g("expert_count", 0) or 0, g("expert_used_count", 0) or 0
    names = {t[0] for t in ts}
    dense_p = dense_b = exp_p = exp_b = 0
    for name, ne, nbytes in ts:
        if name == "token_embd.weight" and "output.weight" in names:
            continue  # one row a token; tied, it is also the output matrix
        if "_exps." in name:
            exp_p += math.prod(ne); exp_b += nbytes
        else:
            dense_p += math.prod(ne); dense_b += nbytes
    heads = g("attention.head_count")
    return {"arch": a, "layers": g("block_count"), "heads": heads, "kv_heads": g("attention.head_count_kv", heads),
            "head_dim": g("embedding_length") // heads, "experts": E, "experts_used": k,
            "params_per_token": dense_p + (exp_p * k // E if E else 0),
            "wread": (lambda n: dense_b + (exp_b * (1 - (1 - k / E) ** n) if E else 0)),
            "weight_bytes_all": dense_b + exp_b}

def timed(cmd, tag):
    """Runs cmd under /usr/bin/time -v; returns (stdout, peak RSS in MB)."""
    tv = f"{work}/{tag}.time"
    r = subprocess.run(["/usr/bin/time", "-v", "-o", tv] + cmd, stdout=subprocess.PIPE,
                       stderr=open(f"{work}/{tag}.err", "w"), env=env, text=True)
    if r.returncode != 0:
        sys.exit(f"anchor.sh: {' '.join(cmd)} failed (exit {r.returncode}); see {work}/{tag}.err")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(tv).read())
    return r.stdout, int(rss.group(1)) / 1024 if rss else None

def run_pipedec(dt, n, rep):
    tag = f"pd.{dt}.{n}.{rep}"
    out = f"{work}/{tag}.jsonl"
    if os.path.exists(out):
        os.remove(out)  # a rerun would skip pages already written
    _, rss = timed([bin_, "run", "--model", f"{work}/m.{dt}.gguf", "--pages", f"{work}/pages/n{n}.jsonl",
                    "--out", out, "--batch", str(n), "--threads", str(T), "--stats", f"{work}/{tag}.stats",
                    "--gemm", os.environ["ANCHOR_GEMM"]], tag)
    s = json.load(open(f"{work}/{tag}.stats"))
    assert s["decode"]["tokens"] > 0, s
    return {"prefill_rows_per_s": s["prefill"]["rows_per_s"], "decode_tokens_per_s": s["decode"]["tokens_per_s"],
            "tokens": s["decode"]["tokens"], "rss_mb": rss}

def parse_batched(text):
    """llama-batched-bench rows: jsonl when the build has --output-format, else its markdown table."""
    rows = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            j = json.loads(line)
            rows[int(j["pl"])] = {"speed_pp": float(j["speed_pp"]), "speed_tg": float(j["speed_tg"])}
        elif line.startswith("|") and re.match(r"\|\s*\d", line):
            c = [x.strip() for x in line.strip("|").split("|")]
            # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
            rows[int(c[2])] = {"speed_pp": float(c[5]), "speed_tg": float(c[7])}
    return rows

def run_llama(dt, rep):
    tag = f"ll.{dt}.{rep}"
    m = f"{work}/m.{dt}.gguf"
    ctx = 64 * (P + NEW) + 64
    base = [f"{llama}/llama-batched-bench", "-m", m, "-c", str(ctx), "-b", "2048", "-ub", "512",
            "-npp", str(P), "-ntg", str(NEW), "-npl", ",".join(map(str, streams)), "-t", str(T)]
    try:
        out, rss = timed(base + ["--output-format", "jsonl"], tag + ".bb")
    except SystemExit:
        out, rss = timed(base, tag + ".bb")  # an older build without --output-format
    bb = parse_batched(out)
    if set(bb) != set(streams):
        sys.exit(f"anchor.sh: could not read llama-batched-bench's results for {streams}; see {work}/{tag}.bb.err")
    if not os.path.exists(f"{llama}/llama-bench"):
        # an install without llama-bench (the node-llama-cpp build): 1 stream from batched-bench
        return {"prefill_1": bb[1]["speed_pp"], "decode_1_llama_bench": None, "prefill_64": bb[64]["speed_pp"],
                "decode": {n: bb[n]["speed_tg"] for n in streams}, "rss_mb": rss}
    out1, rss1 = timed([f"{llama}/llama-bench", "-m", m, "-p", str(P), "-n", str(NEW), "-t", str(T),
                        "-r", "1", "-o", "json"], tag + ".lb")
    lb = json.loads(out1)
    pp = [x["avg_ts"] for x in lb if x.get("n_prompt") == P and x.get("n_gen") == 0]
    tg = [x["avg_ts"] for x in lb if x.get("n_prompt") == 0 and x.get("n_gen") == NEW]
    return {"prefill_1": pp[0] if pp else None, "decode_1_llama_bench": tg[0] if tg else None,
            "prefill_64": bb[64]["speed_pp"], "decode": {n: bb[n]["speed_tg"] for n in streams},
            "rss_mb": max(x for x in (rss, rss1) if x is not None)}

def probe_json(reps_):
    r = subprocess.run([os.environ["ANCHOR_PROBE"], str(T), str(reps_)], stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(r.stdout)

def probe(reps_):
    return probe_json(reps_)["read_bw_gbs"][str(T)]

pd = {dt: {n: [] for n in streams} for dt in dtypes}
ll = {dt: [] for dt in dtypes}
for rep in range(reps):
    for dt in dtypes:
        for n in streams:
            # batch 1 is bandwidth-bound: probe right before and after it too,
            # so its ratio is against the bandwidth of the same seconds
            before = probe(2) if n == 1 else None
            pd[dt][n].append(run_pipedec(dt, n, rep))
            if n == 1:
                pd[dt][n][-1]["bw_adjacent_gbs"] = max(before, probe(2))
            print(f"anchor.sh: rep {rep + 1}/{reps} {dt} pipedec {n} streams: "
                  f"{pd[dt][n][-1]['decode_tokens_per_s']:.1f} tok/s decode", file=sys.stderr)
        if llama:
            ll[dt].append(run_llama(dt, rep))
            print(f"anchor.sh: rep {rep + 1}/{reps} {dt} llama.cpp done", file=sys.stderr)
    # the host's bandwidth drifts: probe again after every repetition
    json.dump(probe_json(3), open(f"{work}/probe.{rep}.json", "w"))

med = lambda xs: statistics.median(xs) if xs and None not in xs else None
def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None
def r1(x):
    return round(x, 1) if x is not None else None

gemm = json.load(open(f"{work}/gemm.json"))
# the limit is the best of the probes before the runs and after each repetition
bw_samples = [json.load(open(f))["read_bw_gbs"][str(T)]
              for f in [f"{work}/probe.json"] + [f"{work}/probe.{r}.json" for r in range(reps)]]
bw = max(bw_samples) * 1e9
g1 = max(max(x["invariant_gflops"], x["openblas_gflops"]) for x in gemm["f32"]) * 1e9
flops_T = g1 * T
cost = {dt: model_cost(f"{work}/m.{dt}.gguf") for dt in dtypes}
c0 = cost[dtypes[0]]
L, heads, kvh, hd = c0["layers"], c0["heads"], c0["kv_heads"], c0["head_dim"]
params = c0["params_per_token"]  # active: layers (top-k experts) + output projection
kv_bytes = L * 2 * kvh * hd * 4 * (P + NEW // 2)  # f32 cache rows read per token at mid-decode
attn_flops = lambda ctx: 4 * L * heads * hd * ctx  # q.k and p.v over ctx rows, every layer

# --gemm int8: Q8_0 and the block types multiply in int8 (vpdpbusd), whose
# limit is the int8 peak of one thread (bench_probe) times T; f32, f16 and
# bf16 weights still multiply in f32. The peak moves with the host's load as
# the bandwidth does (282 and 421 G/s a thread in two runs of one evening):
# the best of the same probes
i8_samples = [json.load(open(f)).get("int8_peak_gops_1t", 0.0)
              for f in [f"{work}/probe.json"] + [f"{work}/probe.{r}.json" for r in range(reps)]]
i8_T = max(i8_samples) * 1e9 * T
def flops_matrices(dt):
    return i8_T if os.environ["ANCHOR_GEMM"] == "int8" and dt not in ("f32", "f16", "bf16") and i8_T > 0 else flops_T

def limit(wread, n, ctx, kv, fm):
    """Tokens (rows) per second at n streams whose step reads wread(n) weight
    bytes: the per-phase rooflines summed (fm: the matrices' compute limit)."""
    matrices = max(2 * params / fm, wread(n) / (n * bw))
    attention = max(attn_flops(ctx) / flops_T, kv / bw)
    return 1 / (matrices + attention)
res = {"bench": "anchor", "quick": quick, "threads": T, "reps": reps, "pipedec_gemm": os.environ["ANCHOR_GEMM"],
       "workload": {"prefill_rows": P, "new_tokens": NEW, "arch": c0["arch"],
                    "shape": {k.lstrip("-"): v for k, v in shape.items()}, "params_per_token": params},
       "limits": {"read_bw_gbs": round(bw / 1e9, 2), "read_bw_gbs_samples": bw_samples, "gemm_gflops_1t": round(g1 / 1e9, 1),
                  "gemm_gflops_assumed_T": round(flops_T / 1e9, 1), "int8_gops_assumed_T": round(i8_T / 1e9, 1),
                  "int8_peak_gops_1t_samples": i8_samples,
                  "note": "T-thread GEMM = T x the best 1-thread f32 rate (an upper bound), the compute limit of "
                          "every weight type under the exact arithmetic (pipedec dequantizes exactly to f32 and "
                          "multiplies in f32); under --gemm int8 the quantized types' matrices are bound by T x "
                          "the 1-thread vpdpbusd peak (int8_gops_assumed_T) instead"},
       "llama_cpp": llama or None, "results": {}}
if quick:
    res["note"] = ("--quick: the model fits in the caches, so the DRAM bandwidth limit does not bound it "
                   "(ratios above 1 are expected); use the full run for figures")
for dt in dtypes:
    wbytes = os.path.getsize(f"{work}/m.{dt}.gguf")
    # bytes of the matrices a step reads (the embedding table is not read: one row per token)
    wread = cost[dt]["wread"]
    d = {"model_bytes": wbytes, "weight_bytes_read_per_step": {str(n): int(wread(n)) for n in streams},
         "pipedec": {}, "limits": {}, "pipedec_vs_limit": {}}
    pre1 = med([x["prefill_rows_per_s"] for x in pd[dt][1]])
    pre64 = med([x["prefill_rows_per_s"] for x in pd[dt][64]])
    dec = {n: med([x["decode_tokens_per_s"] for x in pd[dt][n]]) for n in streams}
    rss = {n: med([x["rss_mb"] for x in pd[dt][n]]) for n in streams}
    d["pipedec"] = {"prefill_rows_per_s_1": r1(pre1), "prefill_rows_per_s_64": r1(pre64),
                    "decode_tokens_per_s": {str(n): r1(dec[n]) for n in streams},
                    "peak_rss_mb": {str(n): r1(rss[n]) for n in streams}}
    # prefill: rows of a chunk share the weights (compute-bound), prefix P/2 on average
    fm = flops_matrices(dt)
    lim_pre = limit(wread, 1 << 30, P / 2, L * 2 * kvh * hd * 4 * P / 2, fm)
    lim_dec = {n: limit(wread, n, P + NEW / 2, kv_bytes, fm) for n in streams}
    d["limits"] = {"prefill_rows_per_s": r1(lim_pre), "decode_tokens_per_s": {str(n): r1(lim_dec[n]) for n in streams}}
    d["pipedec_vs_limit"] = {"prefill_1": ratio(pre1, lim_pre), "prefill_64": ratio(pre64, lim_pre),
                             "decode": {str(n): ratio(dec[n], lim_dec[n]) for n in streams}}
    # the issue-39 goal at 32 and 64 streams: active-parameter work per
    # second against the matrices' compute limit alone
    d["decode_vs_compute_limit"] = {"limit": "int8_peak" if fm != flops_T else "f32_gemm_peak",
                                    **{str(n): ratio(dec[n] * 2 * params, fm) for n in streams}}
    # batch 1 against the better of the probes just before and after each run
    # (medians over repetitions): bytes read per second / that bandwidth
    adj = [(x["decode_tokens_per_s"], x["bw_adjacent_gbs"] * 1e9) for x in pd[dt][1]]
    d["decode_1_vs_adjacent_probe"] = {
        "probes_gbs": [round(b / 1e9, 2) for _, b in adj],
        "weight_bytes": ratio(med([t * wread(1) / b for t, b in adj]), 1),
        "weight_and_kv_bytes": ratio(med([t * (wread(1) + kv_bytes) / b for t, b in adj]), 1)}
    if llama:
        lp1 = med([x["prefill_1"] for x in ll[dt]])
        lp64 = med([x["prefill_64"] for x in ll[dt]])
        ld = {n: med([x["decode"][n] for x in ll[dt]]) for n in streams}
        lrss = med([x["rss_mb"] for x in ll[dt]])
        d["llama_cpp"] = {"prefill_rows_per_s_1": r1(lp1), "prefill_rows_per_s_64": r1(lp64),
                          "decode_tokens_per_s": {str(n): r1(ld[n]) for n in streams},
                          "decode_tokens_per_s_1_llama_bench": r1(med([x["decode_1_llama_bench"] for x in ll[dt]])),
                          "peak_rss_mb_batched_bench": r1(lrss)}
        d["ratio_pipedec_over_llama_cpp"] = {
            "prefill_1": ratio(pre1, lp1), "prefill_64": ratio(pre64, lp64),
            "decode": {str(n): ratio(dec[n], ld[n]) for n in streams},
            "peak_rss_64": ratio(rss[64], lrss)}
    res["results"][dt] = d
print(json.dumps(res, indent=2))
PY

#!/usr/bin/python3
"""Trains the tiny OCR decoder pipedec ships (models/ocr-tiny.gguf).

A decoder with a byte-level vocabulary learns to transcribe pages made by
`pipedec render` (so training and inference share one encoder). By default
(--arch deepseek2-ocr) it is a small DeepSeek mixture of experts laid out as
DeepSeek-OCR's decoder (--arch deepseek: the same in DeepSeek V1 form, whose
RoPE rotates adjacent pairs): --dense-layers
leading dense layers, then layers whose feed-forward is --experts routed
experts (the top --experts-used of them per token) plus --shared shared
experts, each of width --expert-ffn; --arch llama makes every layer dense.
The math below is pipedec's exactly (cluster/model/model.c): RMSNorm
x / sqrt(mean(x^2) + eps) * w, RoPE with angle pos * base^(-2i/d) on the
pairs (i, i + d/2) (NEOX, deepseek2-ocr) or (2i, 2i+1) (deepseek, llama), attention scores q.k / sqrt(d) with a causal softmax,
SwiGLU down(silu(gate h) * up h), a final RMSNorm and an untied output
projection; no embedding scaling. A mixture-of-experts layer is
MODEL_FFN_MOE (cluster/model/model.h): p = softmax(h Wrouter^T) over all
experts, the top-k p_e taken as they are (no renormalisation, no weights
scale: deepseek's expert_weights_scale is written as 1), out = sum over the
k chosen of p_e * SwiGLU_e(h) + the shared experts' SwiGLU(h) (one SwiGLU
of width expert_ffn x shared). Training adds a small load-balancing loss
(Switch Transformer's E * sum_e f_e P_e) so every expert gets tokens; it
only shapes training, not the math the model computes. The trained weights go out as
DIR/config.json + one .npy per tensor and `pipedec mkmodel --from-weights`
assembles the GGUF (the project's writer stays the only one).

Every seed is fixed: the same command gives the same model on the same host
and torch build (CPU only).

usage: scripts/train_ocr.py --build BUILD --work DIR --out MODEL.gguf
                            [--arch deepseek2-ocr|deepseek|llama] [--steps N] [--seed S]
                            [--layers L] [--hidden H] [--experts E] ...
Installs Debian's python3-torch (apt-get) when torch is missing. Run it with
the system interpreter (/usr/bin/python3): Debian's torch lives there.
"""
import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time


def ensure_torch():
    try:
        import torch  # noqa: F401
        import numpy  # noqa: F401
        return
    except ImportError:
        pass
    pol = subprocess.run(["apt-cache", "policy", "python3-torch"], capture_output=True, text=True).stdout
    if "Candidate:" not in pol or "Candidate: (none)" in pol:
        sys.exit("train_ocr: torch is missing and Debian's python3-torch is not installable here "
                 "(apt-cache policy python3-torch shows no candidate)")
    print("train_ocr: torch missing, installing python3-torch with apt-get", file=sys.stderr)
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "python3-torch", "python3-numpy"]
    if os.geteuid() != 0:
        cmd = ["sudo"] + cmd
    subprocess.run(cmd, check=True)
    if sys.executable != "/usr/bin/python3":
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    import torch  # noqa: F401


ensure_torch()
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

BOS, EOS, VOCAB = 256, 257, 258
PROMPT = [ord(c) for c in "OCR:"]

# ---------------------------------------------------------------- text pages

WORDS = """the of and to in is was that for on are with as his they be at one have this from
or had by word but what some we can out other were all there when up use your how said an each
she which do their time if will way about many then them write would like so these her long make
thing see him two has look more day could go come did number sound no most people my over know
water than call first who may down side been now find any new work part take get place made live
where after back little only round man year came show every good me give our under name very
through just form sentence great think say help low line differ turn cause much mean before move
right boy old too same tell does set three want air well also play small end put home read hand
port large spell add even land here must big high such follow act why ask men change went light
kind off need house picture try us again animal point mother world near build self earth father
head stand own page should country found answer school grow study still learn plant cover food
sun four between state keep eye never last let thought city tree cross farm hard start might
story saw far sea draw left late run while press close night real life few north open seem
together next white children begin got walk example ease paper group always music those both mark
often letter until mile river car feet care second book carry took science eat room friend began
idea fish mountain stop once base hear horse cut sure watch color face wood main enough plain
girl usual young ready above ever red list though feel talk bird soon body dog family direct pose
leave song measure door product black short numeral class wind question happen complete ship area
half rock order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb sing
listen six table travel less morning ten simple several vowel toward war lay against pattern slow
center love person money serve appear road map rain rule govern pull cold notice voice unit power
town fine certain fly fall lead cry dark machine note wait plan figure star box noun field rest
correct able pound done beauty drive stood contain front teach week final gave green oh quick
develop ocean warm free minute strong special mind behind clear tail produce fact street inch
multiply nothing course stay wheel full force blue object decide surface deep moon island foot
system busy test record boat common gold possible plane stead dry wonder laugh thousand ago ran
check game shape equate hot miss brought heat snow tire bring yes distant fill east paint language
among grand ball yet wave drop heart am present heavy dance engine position arm wide sail material
size vary settle speak weight general ice matter circle pair include divide syllable felt perhaps
pick sudden count square reason length represent art subject region energy hunt probable bed
brother egg ride cell believe fraction forest sit race window store summer train sleep prove lone
leg exercise wall catch mount wish sky board joy winter sat written wild instrument kept glass
grass cow job edge sign visit past soft fun bright gas weather month million bear finish happy
hope flower clothe strange gone jump baby eight village meet root buy raise solve metal whether
push seven paragraph third shall held hair describe cook floor either result burn hill safe cat
century consider type law bit coast copy phrase silent tall sand soil roll temperature finger
industry value fight lie beat excite natural view sense ear else quite broke case middle kill son
lake moment scale loud spring observe child straight consonant nation dictionary milk speed method
organ pay age section dress cloud surprise quiet stone tiny climb cool design poor lot experiment
bottom key iron single stick flat twenty skin smile crease hole trade melody trip office receive
row mouth exact symbol die least trouble shout except wrote seed tone join suggest clean break lady
yard rise bad blow oil blood touch grew cent mix team wire cost lost brown wear garden equal sent
choose fell fit flow fair bank collect save control decimal gentle woman captain practice separate
difficult doctor please protect noon whose locate ring character insect caught period indicate
radio spoke atom human history effect electric expect crop modern element hit student corner party
supply bone rail imagine provide agree thus capital chair danger fruit rich thick soldier process
operate guess necessary sharp wing create neighbor wash bat rather crowd corn compare poem string
bell depend meat rub tube famous dollar stream fear sight thin triangle planet hurry chief colony
clock mine tie enter major fresh search send yellow gun allow print dead spot desert suit current
lift rose continue block chart hat sell success company subtract event particular deal swim term
opposite wife shoe shoulder spread arrange camp invent cotton born determine quart nine truck noise
level chance gather shop stretch throw shine property column molecule select wrong gray repeat
require broad prepare salt nose plural anger claim continent oxygen sugar death pretty skill women
season solution magnet silver thank branch match suffix especially fig afraid huge sister steel
discuss forward similar guide experience score apple bought led pitch coat mass card band rope slip
win dream evening condition feed tool total basic smell valley nor double seat arrive master track
parent shore division sheet substance favor connect post spend chord fat glad original share
station dad bread charge proper bar offer segment slave duck instant market degree populate chick
dear enemy reply drink occur support speech nature range steam motion path liquid log meant
quotient teeth shell neck""".split()

PRINTABLE = [chr(c) for c in range(32, 127)]
PUNCT = [".", ".", ".", ",", ",", ";", ":", "?", "!"]


def wrap(words, width):
    lines, cur = [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = w if not cur else cur + " " + w
    if cur:
        lines.append(cur)
    return lines


def gen_prose(r, width):
    out = []
    for _ in range(r.randint(3, 12)):
        n = r.randint(3, 14)
        ws = [r.choice(WORDS) for _ in range(n)]
        if r.random() < 0.15:
            ws[r.randrange(n)] = str(r.randint(0, 99999))
        if r.random() < 0.2:
            i = r.randrange(n)
            ws[i] = ws[i].capitalize()
        if r.random() < 0.1:
            i = r.randrange(n)
            ws[i] = r.choice(["(", "\"", "'", "["]) + ws[i] + r.choice([")", "\"", "'", "]"])
        if r.random() < 0.15:
            ws[r.randrange(n - 1)] += ","
        ws[0] = ws[0].capitalize()
        ws[-1] += r.choice(PUNCT if r.random() < 0.6 else [".", "!", "?", "...", ":", ";", " --"])
        out += ws
    lines = wrap(out, width)
    if r.random() < 0.3:
        lines.insert(r.randrange(len(lines) + 1), "")
    if r.random() < 0.2:
        lines = ["  " + l if r.random() < 0.5 else l for l in lines]
    return lines


def gen_number(r):
    k = r.randrange(9)
    if k == 0:
        return "%04d-%02d-%02d" % (r.randint(1900, 2099), r.randint(1, 12), r.randint(1, 28))
    if k == 1:
        return "$%s" % "{:,.2f}".format(r.randint(0, 10 ** r.randint(1, 7)) / 100.0)
    if k == 2:
        return "%+.1f%%" % (r.uniform(-100, 100))
    if k == 3:
        return "#%d" % r.randint(0, 99999)
    if k == 4:
        return "%d.%d.%d.%d" % tuple(r.randint(0, 255) for _ in range(4))
    if k == 5:
        return "(%03d) %03d-%04d" % (r.randint(100, 999), r.randint(0, 999), r.randint(0, 9999))
    if k == 6:
        return "%.*e" % (r.randint(1, 4), r.uniform(-1e6, 1e6))
    if k == 7:
        return "".join(r.choice("0123456789ABCDEF") for _ in range(r.randint(4, 12)))
    return str(r.randint(0, 10 ** r.randint(1, 9)))


def gen_numbers(r, width):
    lines = []
    for _ in range(r.randint(3, 16)):
        parts, cur = [], 0
        for _ in range(r.randint(1, 6)):
            s = gen_number(r)
            if r.random() < 0.3:
                s = r.choice(WORDS) + r.choice([": ", " = ", " ", "- "]) + s
            if cur + len(s) + 2 > width:
                break
            parts.append(s)
            cur += len(s) + 2
        lines.append(r.choice(["  ", " ", ", ", "; ", " | ", "\t"]).replace("\t", "   ").join(parts))
    return lines


def gen_table(r, width):
    ncol = r.randint(2, 5)
    heads = [r.choice(WORDS).capitalize() for _ in range(ncol)]
    rows = []
    for _ in range(r.randint(2, 12)):
        row = []
        for c in range(ncol):
            row.append(r.choice(WORDS) if r.random() < 0.4 else gen_number(r))
        rows.append(row)
    w = [max(len(x) for x in [heads[c]] + [row[c] for row in rows]) for c in range(ncol)]
    style = r.randrange(3)
    sep = [" | ", "  ", " ! "][style] if style < 2 else "|"

    def fmt(cells):
        f = [cells[c].rjust(w[c]) if r.random() < 0.5 else cells[c].ljust(w[c]) for c in range(ncol)]
        line = sep.join(f)
        return ("|" + line + "|") if style == 2 else line.rstrip() if style == 1 else line

    lines = [fmt(heads)]
    if style == 0:
        lines.append("-+-".join("-" * x for x in w))
    elif style == 2:
        lines.append("+" + "+".join("=" * x for x in w) + "+")
    elif r.random() < 0.5:
        lines.append("-" * min(width, sum(w) + 2 * (ncol - 1)))
    lines += [fmt(row) for row in rows]
    return [l[:width] for l in lines]


def gen_random(r, width):
    lines = []
    for _ in range(r.randint(2, 14)):
        n = r.randint(0, width)
        s = []
        while len(s) < n:
            if r.random() < 0.1:
                s += [r.choice(PRINTABLE)] * r.randint(2, 12)
            else:
                s.append(r.choice(PRINTABLE))
        lines.append("".join(s[:n]))
    return lines


def gen_page(r, cells):
    """One page of text that fits `cells` (characters + one per line)."""
    width = r.randint(12, 64)
    kind = r.random()
    if kind < 0.35:
        lines = gen_prose(r, width)
    elif kind < 0.55:
        lines = gen_table(r, width)
    elif kind < 0.75:
        lines = gen_numbers(r, width)
    else:
        lines = gen_random(r, width)
    target = r.randint(8, cells)
    out, used = [], 0
    for l in lines:
        l = l[:120]
        if used + len(l) + 1 > target:
            break
        out.append(l)
        used += len(l) + 1
    if not out:
        out = [lines[0][: max(1, target - 1)]]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the model


def rope_tables(n_pos, hd, base):
    # pipedec's angle: pos * base^(-2i/d), correctly rounded (docs/rope.md);
    # float64 here, then float32 cos / sin as pipedec's table
    i = np.arange(hd // 2, dtype=np.float64)
    freq = np.power(np.float64(base), -(2.0 * i) / hd)
    ang = np.arange(n_pos, dtype=np.float64)[:, None] * freq[None, :]
    return torch.tensor(np.cos(ang), dtype=torch.float32), torch.tensor(np.sin(ang), dtype=torch.float32)


def rope(x, cos, sin, neox):
    # x [B, T, nh, hd]; pairs (i, i + d/2) if neox, else (2i, 2i+1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    if neox:
        x0, x1 = x.chunk(2, dim=-1)
        return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)


def swiglu_param(m, names_shapes, L):
    # q, k, v, gate, up: std 1/sqrt(in); o, down: 0.02/sqrt(2L)
    for n, shape in names_shapes:
        std = 1.0 / math.sqrt(shape[-1]) if n in ("q", "k", "v", "gate", "up", "egate", "eup", "router") \
            else 0.02 / math.sqrt(2 * L)
        setattr(m, n, torch.nn.Parameter(torch.randn(*shape) * std))


class Decoder(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, F, L = cfg["hidden"], cfg["ffn"], cfg["layers"]
        self.cfg = cfg
        self.nh, self.hd = cfg["heads"], H // cfg["heads"]
        self.eps = cfg["rms_eps"]
        self.moe = cfg["arch"] in ("deepseek", "deepseek2-ocr")
        self.neox = cfg["arch"] == "deepseek2-ocr"
        self.embd = torch.nn.Parameter(torch.randn(VOCAB, H))
        self.layers = torch.nn.ModuleList()
        for li in range(L):
            m = torch.nn.Module()
            m.attn_norm = torch.nn.Parameter(torch.ones(H))
            m.ffn_norm = torch.nn.Parameter(torch.ones(H))
            m.is_moe = self.moe and li >= cfg["dense_layers"]
            swiglu_param(m, [("q", (H, H)), ("k", (H, H)), ("v", (H, H)), ("o", (H, H))], L)
            if not m.is_moe:
                swiglu_param(m, [("gate", (F, H)), ("up", (F, H)), ("down", (H, F))], L)
            else:
                E, FE, FS = cfg["experts"], cfg["expert_ffn"], cfg["expert_ffn"] * cfg["shared_experts"]
                swiglu_param(m, [("router", (E, H)), ("egate", (E, FE, H)), ("eup", (E, FE, H)),
                                 ("edown", (E, H, FE)), ("gate", (FS, H)), ("up", (FS, H)), ("down", (H, FS))], L)
            self.layers.append(m)
        self.out_norm = torch.nn.Parameter(torch.ones(H))
        self.out = torch.nn.Parameter(torch.randn(VOCAB, H) * (1.0 / math.sqrt(H)))
        self.aux = torch.zeros(())  # the last forward's load-balancing loss (MoE layers summed)
        self.usage = None           # the last forward's tokens per expert, per MoE layer

    def rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def moe_ffn(self, m, h, valid):
        # MODEL_FFN_MOE: softmax over all experts, top-k by probability (the
        # weights are those probabilities, not renormalised or scaled), the
        # k experts' SwiGLU weighted and summed, the shared experts' added
        B, T, H = h.shape
        x = h.reshape(B * T, H)
        E, K = self.cfg["experts"], self.cfg["experts_used"]
        p = torch.softmax(x @ m.router.t(), dim=-1)
        w, sel = torch.topk(p, K, dim=-1)
        out = torch.zeros_like(x)
        used = []
        for e in range(E):
            rows, rank = (sel == e).nonzero(as_tuple=True)
            used.append(int(valid.reshape(-1)[rows].sum()))
            if rows.numel() == 0:
                continue
            xe = x[rows]
            ye = (Fn.silu(xe @ m.egate[e].t()) * (xe @ m.eup[e].t())) @ m.edown[e].t()
            out = out.index_add(0, rows, ye * w[rows, rank][:, None])
        out = out + (Fn.silu(x @ m.gate.t()) * (x @ m.up.t())) @ m.down.t()
        # load balance over the real (unpadded) tokens: fraction routed f_e
        # (top-k counts / k) times mean probability P_e, times E
        vm = valid.reshape(-1, 1).to(x.dtype)
        nv = vm.sum().clamp(min=1)
        f = torch.zeros(E).index_add(0, sel.reshape(-1), vm.expand(-1, K).reshape(-1)) / (nv * K)
        P = (p * vm).sum(0) / nv
        return out.view(B, T, H), E * (f.detach() * P).sum(), used

    def forward(self, x, cos, sin, valid=None):
        B, T, H = x.shape
        if valid is None:
            valid = torch.ones(B, T, dtype=torch.bool)
        mask = torch.full((T, T), float("-inf")).triu(1)
        aux, usage = torch.zeros(()), []
        for m in self.layers:
            h = self.rms(x, m.attn_norm)
            q = rope((h @ m.q.t()).view(B, T, self.nh, self.hd), cos[:T], sin[:T], self.neox).transpose(1, 2)
            k = rope((h @ m.k.t()).view(B, T, self.nh, self.hd), cos[:T], sin[:T], self.neox).transpose(1, 2)
            v = (h @ m.v.t()).view(B, T, self.nh, self.hd).transpose(1, 2)
            s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd)) + mask
            a = torch.softmax(s, dim=-1) @ v
            x = x + a.transpose(1, 2).reshape(B, T, H) @ m.o.t()
            h = self.rms(x, m.ffn_norm)
            if m.is_moe:
                y, la, used = self.moe_ffn(m, h, valid)
                x = x + y
                aux = aux + la
                usage.append(used)
            else:
                x = x + (Fn.silu(h @ m.gate.t()) * (h @ m.up.t())) @ m.down.t()
        self.aux, self.usage = aux, usage
        return self.rms(x, self.out_norm) @ self.out.t()


def export(model, cfg, d):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1, sort_keys=True)
    t = {"token_embd.weight": model.embd, "output_norm.weight": model.out_norm[None, :], "output.weight": model.out}
    for i, m in enumerate(model.layers):
        p = "blk.%d." % i
        t.update({p + "attn_norm.weight": m.attn_norm[None, :], p + "ffn_norm.weight": m.ffn_norm[None, :],
                  p + "attn_q.weight": m.q, p + "attn_k.weight": m.k, p + "attn_v.weight": m.v,
                  p + "attn_output.weight": m.o})
        if not m.is_moe:
            t.update({p + "ffn_gate.weight": m.gate, p + "ffn_up.weight": m.up, p + "ffn_down.weight": m.down})
        else:
            # expert stacks by rows: expert e is rows [e * out, (e + 1) * out)
            # (pipedec mkmodel --from-weights writes the 3-D GGUF stacks)
            E = m.egate.shape[0]
            t.update({p + "ffn_gate_inp.weight": m.router,
                      p + "ffn_gate_exps.weight": m.egate.reshape(E * m.egate.shape[1], -1),
                      p + "ffn_up_exps.weight": m.eup.reshape(E * m.eup.shape[1], -1),
                      p + "ffn_down_exps.weight": m.edown.reshape(E * m.edown.shape[1], -1),
                      p + "ffn_gate_shexp.weight": m.gate, p + "ffn_up_shexp.weight": m.up,
                      p + "ffn_down_shexp.weight": m.down})
    for n, v in t.items():
        np.save(os.path.join(d, n + ".npy"), np.ascontiguousarray(v.detach().numpy().astype(np.float32)))


# ---------------------------------------------------------------- data


def render_chunk(pipedec, model_gguf, texts, d):
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    tf = os.path.join(d, "text.txt")
    with open(tf, "w") as f:
        f.write("\f".join(texts))
    subprocess.run([pipedec, "render", "--text", tf, "--model", model_gguf, "--out", d], check=True,
                   stdout=subprocess.DEVNULL)
    pages = []
    with open(os.path.join(d, "pages.jsonl")) as f:
        for line, text in zip(f, texts):
            pg = json.loads(line)
            emb = np.load(os.path.join(d, pg["prefill"][1]["embeddings"]))
            # render writes the prompt as {"text": ...} when the model's own
            # tokenizer gives back its ids: with the byte vocabulary the ids
            # are the text's bytes
            seg = pg["prefill"][2]
            prompt = seg["tokens"] if "tokens" in seg else list(seg["text"].encode("utf-8"))
            pages.append((torch.tensor(emb), prompt, list(text.encode("ascii"))))
    shutil.rmtree(d)
    return pages


def make_batch(model, pages):
    """Inputs [B, T, H] (BOS, cells, prompt, text), targets (text, EOS) and
    the mask of real (unpadded) positions."""
    seqs, tgts = [], []
    T = 0
    for emb, prompt, text in pages:
        toks_before = torch.tensor([BOS])
        tail = torch.tensor(prompt + text, dtype=torch.long)
        x = torch.cat([model.embd[toks_before], emb, model.embd[tail]], 0)
        y = torch.full((x.shape[0],), -100, dtype=torch.long)
        start = 1 + emb.shape[0] + len(prompt) - 1
        y[start:start + len(text) + 1] = torch.tensor(text + [EOS])
        seqs.append(x)
        tgts.append(y)
        T = max(T, x.shape[0])
    H = seqs[0].shape[1]
    X = torch.zeros(len(seqs), T, H)
    Y = torch.full((len(seqs), T), -100, dtype=torch.long)
    V = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, (x, y) in enumerate(zip(seqs, tgts)):
        X[i, : x.shape[0]] = x
        Y[i, : y.shape[0]] = y
        V[i, : x.shape[0]] = True
    return X, Y, V


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="build directory holding pipedec")
    ap.add_argument("--work", required=True, help="scratch directory (chunks, exported weights)")
    ap.add_argument("--out", required=True, help="the GGUF to write (f16)")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=384)
    ap.add_argument("--cells", type=int, default=192)
    ap.add_argument("--arch", choices=["deepseek2-ocr", "deepseek", "llama"], default="deepseek2-ocr")
    ap.add_argument("--dense-layers", type=int, default=1, help="deepseek: leading dense layers")
    ap.add_argument("--experts", type=int, default=8, help="deepseek: routed experts per MoE layer")
    ap.add_argument("--experts-used", type=int, default=2, help="deepseek: top-k experts per token")
    ap.add_argument("--expert-ffn", type=int, default=96, help="deepseek: one expert's SwiGLU width")
    ap.add_argument("--shared", type=int, default=1, help="deepseek: shared experts")
    ap.add_argument("--balance", type=float, default=0.01, help="deepseek: load-balancing loss weight")
    ap.add_argument("--chunk", type=int, default=256, help="pages rendered at a time")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=100)
    a = ap.parse_args()

    random.seed(a.seed)
    np.random.seed(a.seed)
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    os.makedirs(a.work, exist_ok=True)
    # a private copy: a rebuild of BUILD while training runs must not race an exec
    pipedec = os.path.join(a.work, "pipedec")
    shutil.copy2(os.path.join(a.build, "pipedec"), pipedec)
    cfg = {"arch": a.arch, "layers": a.layers, "hidden": a.hidden, "heads": a.heads, "kv_heads": a.heads,
           "ffn": a.ffn, "ctx": 2 * a.cells + 64, "rope_base": 10000.0, "rms_eps": 1e-5, "vocab": "bytes",
           "ocr_cells": a.cells, "ocr_prompt": PROMPT,
           "name": "pipedec ocr-tiny (scripts/train_ocr.py %s seed %d, %d steps)" % (a.arch, a.seed, a.steps)}
    if a.arch != "llama":
        if not (0 <= a.dense_layers < a.layers and 1 <= a.experts_used <= a.experts):
            sys.exit("train_ocr: need 0 <= --dense-layers < --layers and 1 <= --experts-used <= --experts")
        cfg.update({"dense_layers": a.dense_layers, "experts": a.experts, "experts_used": a.experts_used,
                    "expert_ffn": a.expert_ffn, "shared_experts": a.shared, "expert_gating": "softmax",
                    "expert_weights_norm": False, "expert_weights_scale": 1.0})
    model = Decoder(cfg)
    cos, sin = rope_tables(cfg["ctx"], a.hidden // a.heads, cfg["rope_base"])

    # the untrained model gives render the page layout (hidden size, cells,
    # prompt) and proves the export path before any time is spent
    layout = os.path.join(a.work, "layout.gguf")
    export(model, cfg, os.path.join(a.work, "layout"))
    subprocess.run([pipedec, "mkmodel", "--from-weights", os.path.join(a.work, "layout"), "--out", layout],
                   check=True, stdout=subprocess.DEVNULL)

    val_rng = random.Random(a.seed * 1000003 + 7)
    val = render_chunk(pipedec, layout, [gen_page(val_rng, a.cells) for _ in range(32)],
                       os.path.join(a.work, "val"))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.98), weight_decay=0.0)
    warm = max(1, a.steps // 20)

    def lr_at(s):
        if s < warm:
            return a.lr * (s + 1) / warm
        p = (s - warm) / max(1, a.steps - warm)
        return a.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * p)))

    def evaluate():
        model.eval()
        ok = tot = 0
        usage = None
        with torch.no_grad():
            for i in range(0, len(val), 8):
                X, Y, Vd = make_batch(model, val[i:i + 8])
                pred = model(X, cos, sin, Vd).argmax(-1)
                m = Y >= 0
                ok += int((pred[m] == Y[m]).sum())
                tot += int(m.sum())
                u = model.usage
                usage = u if usage is None else [[a + b for a, b in zip(x, y)] for x, y in zip(usage, u)]
        model.train()
        return ok / tot, usage

    t0 = time.time()
    pages, chunk_no, step = [], 0, 0
    train_rng = random.Random(a.seed)
    while step < a.steps:
        if len(pages) < a.batch:
            texts = [gen_page(train_rng, a.cells) for _ in range(a.chunk)]
            pages = render_chunk(pipedec, layout, texts, os.path.join(a.work, "chunk"))
            chunk_no += 1
        batch, pages = pages[: a.batch], pages[a.batch:]
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        X, Y, Vd = make_batch(model, batch)
        logits = model(X, cos, sin, Vd)
        loss = Fn.cross_entropy(logits.view(-1, VOCAB), Y.view(-1), ignore_index=-100)
        opt.zero_grad()
        (loss + a.balance * model.aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0:
            print("step %d loss %.4f lr %.2e %.0fs" % (step, loss.item(), lr_at(step), time.time() - t0), flush=True)
        if step % a.eval_every == 0 or step == a.steps:
            acc, usage = evaluate()
            print("step %d teacher-forced char accuracy (32 validation pages) %.4f" % (step, acc), flush=True)
            for li, u in enumerate(usage or []):
                print("step %d MoE layer %d tokens per expert (validation, top-%d picks): %s"
                      % (step, a.dense_layers + li, a.experts_used, u), flush=True)

    wdir = os.path.join(a.work, "weights")
    export(model, cfg, wdir)
    subprocess.run([pipedec, "mkmodel", "--from-weights", wdir, "--dtype", "f16", "--out", a.out], check=True)
    print("train_ocr: %d steps of %d pages in %.0f s; wrote %s" % (a.steps, a.batch, time.time() - t0, a.out))


if __name__ == "__main__":
    main()

/* pipedec mkmodel: write a deterministic synthetic model. */
#include "base/check.h"
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"
#include "cluster/cli/fromweights.h"
#include "cluster/cli/mkmmproj.h"
#include "cluster/cli/mkmodel.h"

#include <getopt.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static void mkmodel_usage(FILE *f)
{
    fprintf(f, "usage: pipedec mkmodel --out FILE [--arch llama|qwen2|deepseek|deepseek2-ocr] [--layers N] [--hidden N]\n"
               "                        [--heads N] [--kv-heads N] [--ffn N] [--vocab N] [--ctx N]\n"
               "                        [--dtype|--type f32|f16|bf16|q8_0|q4_0|q5_0|q4_k|q5_k|q6_k] [--seed S]\n"
               "                        [--eos-boost X] [--repeat P]\n"
               "       deepseek only:   [--dense-layers N] [--experts N] [--experts-used K]\n"
               "                        [--expert-ffn N] [--shared N] [--expert-scale X]\n"
               "       deepseek2-ocr:   [--rope-scaling none|linear|yarn] [--rope-factor X] [--rope-orig-ctx N]\n"
               "                        [--yarn-log-mul X]   (rope.scaling.* keys, as llama.cpp's converter writes)\n"
               "  --arch deepseek2-ocr (DeepSeek-OCR as llama.cpp's converter writes it: NEOX rope) and deepseek (V1)\n"
               "  default to DeepSeek-OCR's decoder: 12 layers, hidden 1280, 10 heads (MHA),\n"
               "  1 dense layer of ffn 6848, 64 experts (top 6) of ffn 896, 2 shared, vocab 129280, ctx 8192\n"
               "       or:              pipedec mkmodel --from-weights DIR --out FILE [--dtype f32|f16]\n"
               "  --from-weights DIR: a trained llama or deepseek model (DIR/config.json + one .npy per tensor, see docs/ocr.md)\n"
               "       or:              pipedec mkmodel --revocab IN.gguf --out FILE\n"
               "  --revocab IN: IN's byte vocabulary rewritten as --from-weights writes it (merges, pre), every\n"
               "                other key and every tensor byte copied (OUT may be IN)\n"
               "       or:              pipedec mkmodel --to-ocr IN.gguf --out FILE\n"
               "  --to-ocr IN: a deepseek (V1) file as the same network in deepseek2-ocr form: each head's q/k rows\n"
               "               reordered from adjacent-pair to NEOX rope, keys renamed, no retraining (OUT may be IN)\n"
               "  --repeat P: greedy text cycles through the vocabulary's last P tokens (speculation benchmarks)\n"
               "       or:              pipedec mkmodel --mmproj FILE --hidden H [--seed S] [--dtype f32|f16]\n"
               "                        [--sam-layers N] [--sam-width N] [--sam-heads N] [--window N]\n"
               "                        [--clip-layers N] [--clip-width N] [--clip-heads N]\n"
               "  --mmproj FILE: a random DeepSeek-OCR vision projector (clip's \"deepseekocr\") whose rows have\n"
               "  width H, for a --arch deepseek2-ocr decoder of --hidden H; defaults: SAM 3 layers x 32 (2 heads),\n"
               "  window 14, CLIP 2 layers x 64 (4 heads), f32, seed 1\n");
}

/* The long name of the first option in opts whose letter is in mask (the
 * `given` bits below), for messages that name the flag. */
static const char *mkmodel_flag(const struct option *opts, uint64_t mask)
{
    for (const struct option *o = opts; o->name; o++)
        if (o->val >= 'A' && o->val <= 'z' && (mask & (1ull << (o->val - 'A'))))
            return o->name;
    return "?";
}

/* A parsed command line: the model's and the projector's options, the
 * letters of the flags given (`given`, bit letter - 'A'; 'z' - 'A' < 64),
 * and the files of the other modes. */
typedef struct mkmodel_args {
    mkmodel_opts mo;
    mkmmproj_opts mm;
    uint64_t given;
    const char *out, *from, *mmproj, *revocab, *to_ocr;
} mkmodel_args;

static pd_status mkmodel_flag_set(void *ctx, int ch, const char *arg, pd_err *e)
{
    mkmodel_args *a = ctx;
    pd_status st = PD_OK;
    if (ch >= 'A' && ch <= 'z')
        a->given |= 1ull << (ch - 'A');
    switch (ch) {
    case 'a':
        if (strcmp(arg, "llama") == 0)
            a->mo.arch = MODEL_ARCH_LLAMA;
        else if (strcmp(arg, "qwen2") == 0)
            a->mo.arch = MODEL_ARCH_QWEN2;
        else if (strcmp(arg, "deepseek") == 0)
            a->mo.arch = MODEL_ARCH_DEEPSEEK;
        else if (strcmp(arg, "deepseek2-ocr") == 0)
            a->mo.arch = MODEL_ARCH_DEEPSEEK2_OCR;
        else
            st = pd_err_set(e, PD_ERR_ARG, "--arch '%s': expected llama, qwen2, deepseek or deepseek2-ocr", arg);
        break;
    case 'D': st = cli_u32("--dense-layers", arg, 0, 1024, &a->mo.dense_lead, e); break;
    case 'E': st = cli_u32("--experts", arg, 1, 512, &a->mo.experts, e); break;
    case 'K': st = cli_u32("--experts-used", arg, 1, 512, &a->mo.experts_used, e); break;
    case 'F': st = cli_u32("--expert-ffn", arg, 1, 1u << 20, &a->mo.expert_ffn, e); break;
    case 'S': st = cli_u32("--shared", arg, 1, 1024, &a->mo.shared, e); break;
    case 'X': {
        char *end;
        a->mo.expert_scale = strtof(arg, &end);
        if (*end || !(a->mo.expert_scale > 0.0f) || a->mo.expert_scale > 1e6f)
            st = pd_err_set(e, PD_ERR_ARG, "--expert-scale '%s': expected a number in (0, 1e6]", arg);
        break;
    }
    case 'l': st = cli_u32("--layers", arg, 1, 1024, &a->mo.layers, e); break;
    case 'H': st = cli_u32("--hidden", arg, 2, 65536, &a->mo.hidden, e); break;
    case 'j': st = cli_u32("--heads", arg, 1, 1024, &a->mo.heads, e); break;
    case 'k': st = cli_u32("--kv-heads", arg, 1, 1024, &a->mo.kv_heads, e); break;
    case 'f': st = cli_u32("--ffn", arg, 1, 1u << 20, &a->mo.ffn, e); break;
    case 'v': st = cli_u32("--vocab", arg, 1, 1u << 20, &a->mo.vocab, e); break;
    case 'c': st = cli_u32("--ctx", arg, 16, 1u << 24, &a->mo.ctx, e); break;
    case 'd':
        if (strcmp(arg, "f32") == 0)
            a->mo.dtype = MK_F32;
        else if (strcmp(arg, "f16") == 0)
            a->mo.dtype = MK_F16;
        else if (strcmp(arg, "bf16") == 0)
            a->mo.dtype = MK_BF16;
        else {
            a->mo.dtype = MK_DTYPE_COUNT;
            for (int t = MK_Q8_0; t < MK_DTYPE_COUNT; t++)
                if (strcasecmp(arg, mk_dtype_name((mk_dtype)t)) == 0)
                    a->mo.dtype = (mk_dtype)t;
            if (a->mo.dtype == MK_DTYPE_COUNT)
                st = pd_err_set(e, PD_ERR_ARG, "--dtype '%s': expected f32, f16, bf16, q8_0, q4_0, q5_0, q4_k, q5_k or q6_k",
                                arg);
        }
        break;
    case 's': st = cli_u64("--seed", arg, &a->mo.seed, e); break;
    case 'e': {
        char *end;
        a->mo.eos_boost = strtof(arg, &end);
        if (*end || !(a->mo.eos_boost > 0.0f) || a->mo.eos_boost > 1000.0f)
            st = pd_err_set(e, PD_ERR_ARG, "--eos-boost '%s': expected a number in (0, 1000]", arg);
        break;
    }
    case 'R': st = cli_u32("--repeat", arg, 1, 1u << 20, &a->mo.repeat, e); break;
    case 'o': a->out = arg; break;
    case 'M': a->mmproj = arg; break;
    case 'm': st = cli_u32("--sam-layers", arg, 1, 64, &a->mm.sam_layers, e); break;
    case 'n': st = cli_u32("--sam-width", arg, 1, 4096, &a->mm.sam_width, e); break;
    case 'p': st = cli_u32("--sam-heads", arg, 1, 4096, &a->mm.sam_heads, e); break;
    case 'q': st = cli_u32("--clip-layers", arg, 1, 64, &a->mm.clip_layers, e); break;
    case 'r': st = cli_u32("--clip-width", arg, 4, 4096, &a->mm.clip_width, e); break;
    case 't': st = cli_u32("--clip-heads", arg, 1, 4096, &a->mm.clip_heads, e); break;
    case 'w': st = cli_u32("--window", arg, 1, 64, &a->mm.window, e); break;
    case 'W': a->from = arg; break;
    case 'V': a->revocab = arg; break;
    case 'T': a->to_ocr = arg; break;
    case 'Y': a->mo.rope_scaling = arg; break;
    case 'G':
    case 'L': {
        char *end;
        float v = strtof(arg, &end);
        if (*end || !(v >= 0.0f) || v > 1e6f)
            st = pd_err_set(e, PD_ERR_ARG, "%s '%s': expected a number in [0, 1e6]",
                            ch == 'G' ? "--rope-factor" : "--yarn-log-mul", arg);
        else if (ch == 'G')
            a->mo.rope_factor = v;
        else
            a->mo.yarn_log_mul = v;
        break;
    }
    case 'O': st = cli_u32("--rope-orig-ctx", arg, 1, 1u << 24, &a->mo.rope_orig_ctx, e); break;
    default: CHECKF(0, "mkmodel: option code %d without its case", ch);
    }
    return st;
}

/* getopt_long codes: the `given` bits (letter - 'A'); 'h' is --help. */
static const struct option mkmodel_longopts[] = {
    {"arch", required_argument, 0, 'a'},   {"layers", required_argument, 0, 'l'},
    {"hidden", required_argument, 0, 'H'}, {"heads", required_argument, 0, 'j'},
    {"kv-heads", required_argument, 0, 'k'}, {"ffn", required_argument, 0, 'f'},
    {"vocab", required_argument, 0, 'v'},  {"ctx", required_argument, 0, 'c'},
    {"dtype", required_argument, 0, 'd'}, {"type", required_argument, 0, 'd'},  {"seed", required_argument, 0, 's'},
    {"out", required_argument, 0, 'o'},    {"eos-boost", required_argument, 0, 'e'},
    {"dense-layers", required_argument, 0, 'D'}, {"experts", required_argument, 0, 'E'},
    {"experts-used", required_argument, 0, 'K'}, {"expert-ffn", required_argument, 0, 'F'},
    {"shared", required_argument, 0, 'S'},  {"expert-scale", required_argument, 0, 'X'},
    {"repeat", required_argument, 0, 'R'}, {"from-weights", required_argument, 0, 'W'}, {"help", no_argument, 0, 'h'},
    {"mmproj", required_argument, 0, 'M'}, {"sam-layers", required_argument, 0, 'm'},
    {"sam-width", required_argument, 0, 'n'}, {"sam-heads", required_argument, 0, 'p'},
    {"clip-layers", required_argument, 0, 'q'}, {"clip-width", required_argument, 0, 'r'},
    {"clip-heads", required_argument, 0, 't'}, {"window", required_argument, 0, 'w'},
    {"revocab", required_argument, 0, 'V'}, {"rope-scaling", required_argument, 0, 'Y'},
    {"rope-factor", required_argument, 0, 'G'}, {"rope-orig-ctx", required_argument, 0, 'O'},
    {"yarn-log-mul", required_argument, 0, 'L'}, {"to-ocr", required_argument, 0, 'T'},
    {0, 0, 0, 0}};

/* no check: which flags go together depends on the mode, decided below */
static const cli_cmd mkmodel_cli = {
    .name = "mkmodel", .opts = mkmodel_longopts, .flag = mkmodel_flag_set, .usage = mkmodel_usage};

int cmd_mkmodel(int argc, char **argv)
{
    const struct option *opts = mkmodel_longopts;
    /* options are parsed into mo and remembered in `given`; an architecture's
     * defaults then fill what was not given, whatever the flag order */
    mkmodel_args a = {0};
    mkmodel_defaults(&a.mo);
    mkmmproj_defaults(&a.mm);
    int rc = cli_parse(&mkmodel_cli, argc, argv, &a, stdout, stderr);
    if (rc != CLI_GO)
        return rc;
    pd_err e = {0};
    pd_status st = PD_OK;
    mkmodel_opts mo = a.mo;
    mkmmproj_opts mm = a.mm;
    const uint64_t given = a.given;
    const char *out = a.out, *from = a.from, *mmproj = a.mmproj, *revocab = a.revocab, *to_ocr = a.to_ocr;
#define BIT(letter) (1ull << ((letter) - 'A'))
    /* the vision projector's flags, and the model flags it shares */
    const uint64_t mm_only = BIT('m') | BIT('n') | BIT('p') | BIT('q') | BIT('r') | BIT('t') | BIT('w');
    const uint64_t mm_flags = BIT('M') | BIT('H') | BIT('s') | BIT('d') | mm_only;
    if (st == PD_OK && !mmproj && (given & mm_only))
        st = pd_err_set(&e, PD_ERR_ARG, "--%s describes a vision projector: it needs --mmproj FILE",
                        mkmodel_flag(opts, given & mm_only));
    if (st == PD_OK && mmproj && (given & ~mm_flags))
        st = pd_err_set(&e, PD_ERR_ARG, "--mmproj does not take --%s (only --hidden, --seed, --dtype, --sam-layers, "
                                        "--sam-width, --sam-heads, --window, --clip-layers, --clip-width, --clip-heads)",
                        mkmodel_flag(opts, given & ~mm_flags));
    if (st == PD_OK && mmproj && !(given & BIT('H')))
        st = pd_err_set(&e, PD_ERR_ARG, "--mmproj needs --hidden H, the hidden size of the decoder it feeds");
    if (st == PD_OK && mmproj) {
        mm.hidden = mo.hidden;
        mm.seed = mo.seed;
        mm.dtype = mo.dtype;
        st = mkmmproj_write(&mm, mmproj, &e);
        if (st == PD_OK) {
            printf("pipedec mkmodel: wrote %s (deepseekocr mmproj, output width %u; SAM %u layers x %u, %u heads, "
                   "window %u; CLIP %u layers x %u, %u heads; %s, seed %llu)\n",
                   mmproj, mm.hidden, mm.sam_layers, mm.sam_width, mm.sam_heads, mm.window, mm.clip_layers,
                   mm.clip_width, mm.clip_heads, mk_dtype_name(mm.dtype), (unsigned long long)mm.seed);
            return 0;
        }
    }
#undef BIT
    if (st == PD_OK && !mmproj && model_arch_is_moe(mo.arch)) {
        mkmodel_opts d;
        mkmodel_defaults_deepseek(&d);
        d.arch = mo.arch;
#define KEEP(letter, field) \
    if (given & (1ull << ((letter) - 'A')))  \
        d.field = mo.field;
        KEEP('l', layers) KEEP('H', hidden) KEEP('j', heads) KEEP('k', kv_heads) KEEP('f', ffn)
        KEEP('v', vocab) KEEP('c', ctx) KEEP('d', dtype) KEEP('s', seed) KEEP('e', eos_boost) KEEP('R', repeat)
        KEEP('D', dense_lead) KEEP('E', experts) KEEP('K', experts_used) KEEP('F', expert_ffn)
        KEEP('S', shared) KEEP('X', expert_scale) KEEP('Y', rope_scaling) KEEP('G', rope_factor)
        KEEP('O', rope_orig_ctx) KEEP('L', yarn_log_mul)
#undef KEEP
        mo = d;
    } else if (st == PD_OK && (given & ((1ull << ('D' - 'A')) | (1ull << ('E' - 'A')) | (1ull << ('K' - 'A')) |
                                        (1ull << ('F' - 'A')) | (1ull << ('S' - 'A')) | (1ull << ('X' - 'A')))))
        st = pd_err_set(&e, PD_ERR_ARG, "the expert options need --arch deepseek or deepseek2-ocr");
    if (st == PD_OK && !out)
        st = pd_err_set(&e, PD_ERR_ARG, "--out FILE is required");
    if (st == PD_OK && from && (given & ~((1ull << ('W' - 'A')) | (1ull << ('o' - 'A')) | (1ull << ('d' - 'A')))))
        st = pd_err_set(&e, PD_ERR_ARG, "--from-weights takes only --out and --dtype");
    if (st == PD_OK && revocab && (given & ~((1ull << ('V' - 'A')) | (1ull << ('o' - 'A')))))
        st = pd_err_set(&e, PD_ERR_ARG, "--revocab takes only --out");
    if (st == PD_OK && revocab) {
        st = fromweights_revocab(revocab, out, &e);
        if (st == PD_OK) {
            printf("pipedec mkmodel: wrote %s from %s (byte vocabulary rewritten, tensors copied)\n", out, revocab);
            return 0;
        }
    }
    if (st == PD_OK && to_ocr && (given & ~((1ull << ('T' - 'A')) | (1ull << ('o' - 'A')))))
        st = pd_err_set(&e, PD_ERR_ARG, "--to-ocr takes only --out");
    if (st == PD_OK && to_ocr) {
        st = fromweights_to_ocr(to_ocr, out, &e);
        if (st == PD_OK) {
            printf("pipedec mkmodel: wrote %s from %s (deepseek2-ocr: keys renamed, q/k rows reordered for NEOX "
                   "rope, other tensors copied)\n", out, to_ocr);
            return 0;
        }
    }
    if (st == PD_OK && from && mo.dtype != MK_F32 && mo.dtype != MK_F16)
        st = pd_err_set(&e, PD_ERR_ARG, "--from-weights writes --dtype f32 or f16");
    if (st == PD_OK && from) {
        st = fromweights_write(from, mo.dtype == MK_F16, out, &e);
        if (st == PD_OK) {
            printf("pipedec mkmodel: wrote %s from %s (%s)\n", out, from, mo.dtype == MK_F16 ? "f16" : "f32");
            return 0;
        }
    }
    if (st == PD_OK)
        st = mkmodel_write(&mo, out, &e);
    if (st != PD_OK) {
        fprintf(stderr, "pipedec mkmodel: %s\n", e.msg);
        if (st == PD_ERR_ARG)
            mkmodel_usage(stderr);
        return 2;
    }
    printf("pipedec mkmodel: wrote %s (%s, %u layers, hidden %u, %u heads / %u kv heads, ffn %u, vocab %u, %s",
           out, model_arch_name(mo.arch), mo.layers, mo.hidden, mo.heads, mo.kv_heads, mo.ffn, mo.vocab,
           mk_dtype_name(mo.dtype));
    if (model_arch_is_moe(mo.arch))
        printf("; %u dense layers, %u experts (top %u) of ffn %u, %u shared", mo.dense_lead, mo.experts,
               mo.experts_used, mo.expert_ffn, mo.shared);
    printf(")\n");
    return 0;
}

/* Reference page input through llama.cpp's libmtmd (the prefix
 * scripts/llama_cpp.sh builds; compiled by the anchor scripts against it,
 * never part of the pipedec build). For one image and one prompt it writes
 * what a decoder is fed, chunk by chunk, as llama-mtmd-cli builds it, and
 * optionally the greedy continuation:
 *
 *   mtmd_embed MODEL MMPROJ IMAGE PROMPT OUTDIR [N_NEW [THREADS]]
 *
 * PROMPT is what llama-mtmd-cli's -p would be after the "deepseek-ocr" chat
 * template (which adds nothing): if it lacks mtmd's media marker
 * ("<__media__>") the marker is put in front, as llama-mtmd-cli does for one
 * image. It is tokenized by mtmd_tokenize with add_special (BOS) and
 * parse_special. For DeepSeek-OCR the projector ends an image with the text
 * "\n" itself, so DeepSeek's "<image>\nFree OCR." is the PROMPT "Free OCR.".
 *
 * OUTDIR/chunks.jsonl, one line per chunk in order (positions count from 0
 * at the first chunk; pos is the chunk's first decoder position):
 *   {"i":0,"type":"text","pos":0,"n_tokens":1,"n_pos":1,"tokens":[0]}
 *   {"i":1,"type":"image","pos":1,"n_tokens":210,"n_pos":210,"id":"<sha256>",
 *    "npy":"chunk_001.npy","rows":210,"width":64,"nonfinite":0,"max_abs":3.1}
 *   ...
 * then, with N_NEW > 0, one line
 *   {"type":"generated","tokens":[..],"margins":[..]}
 * where margins[i] is the best minus the second-best logit of token i
 * (argmax, ties to the lower id; stops after an end-of-generation token),
 * and OUTDIR/generated.txt holds those tokens' pieces, raw bytes, as
 * llama-mtmd-cli prints them.
 * OUTDIR/chunk_NNN.npy (NNN = the chunk's index i): the image chunk's rows as
 * mtmd_encode_chunk + mtmd_get_output_embd return them, NumPy v1.0 '<f4',
 * C order, shape (rows, width), width = llama_model_n_embd_inp.
 * Stdout gets one summary line per chunk. Exit status: 0, 1 on a failure
 * (named on stderr), 3 when an embedding value is NaN or infinite (the files
 * are still written).
 *
 * Taps, to find where a reimplementation departs: PD_MTMD_TAPS, a
 * comma-separated list of clip graph tensor names, adds for each image chunk
 * OUTDIR/chunk_NNN.<name>.npy, '<f4' of shape (ne3, ne2, ne1, ne0) in ggml's
 * order (ne0 fastest), as the graph computed it. "inp_raw" is the chunk's
 * normalized pixels as the graph receives them (x, y, channel, image); for
 * deepseekocr (models/deepseekocr.cpp) also "sam_layer_out-L",
 * "sam_output" (the SAM grid after net_3), "pos_embed", "layer_out-L"
 * (CLIP), "dsocr_output" (the rows above). A name absent from the graph is
 * absent from OUTDIR. Only the dump's own encodes are tapped, not the
 * generation's. */
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"
#include "mtmd-helper.h"
#include "mtmd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

/* NumPy v1.0: magic, version, u16 header length, a dict padded with spaces
 * and ended by '\n' so the data starts at a multiple of 64. */
static int write_npy_nd(const char *path, const float *x, const size_t *shape, int nd)
{
    char dims[160] = "", hdr[256];
    size_t count = 1;
    for (int i = 0; i < nd; i++) {
        size_t l = strlen(dims);
        snprintf(dims + l, sizeof dims - l, "%zu%s", shape[i], (nd == 1 || i < nd - 1) ? ", " : "");
        count *= shape[i];
    }
    int n = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", dims);
    size_t total = 10 + (size_t)n + 1, pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
    const size_t hlen = (size_t)n + pad + 1;
    const unsigned char len[2] = {(unsigned char)(hlen & 0xff), (unsigned char)(hlen >> 8)};
    int ok = fwrite(magic, 1, 8, f) == 8 && fwrite(len, 1, 2, f) == 2 && fwrite(hdr, 1, (size_t)n, f) == (size_t)n;
    for (size_t i = 0; ok && i < pad; i++)
        ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    /* little-endian hosts only (x86-64, aarch64): the floats go as they are */
    ok = ok && fwrite(x, sizeof *x, count, f) == count;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static int write_npy(const char *path, const float *x, size_t rows, size_t width)
{
    const size_t shape[2] = {rows, width};
    return write_npy_nd(path, x, shape, 2);
}

/* The eval callback's state: which names to write, for which chunk. */
typedef struct taps {
    const char *names; /* PD_MTMD_TAPS, or NULL */
    const char *outdir;
    int on;            /* only during the dump's own encodes */
    size_t chunk;
    int failed;
} taps;

static int tap_wanted(const taps *tp, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = tp->names; p && *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0)
            return 1;
        p = e ? e + 1 : p + len;
    }
    return 0;
}

/* The graph input "inp_raw" is a leaf, never passed to the callback: it is
 * taken from the first node that reads it. */
static struct ggml_tensor *tap_inp_raw(struct ggml_tensor *t)
{
    for (int i = 0; i < GGML_MAX_SRC; i++)
        if (t->src[i] && strcmp(t->src[i]->name, "inp_raw") == 0)
            return t->src[i];
    return NULL;
}

static void tap_write(taps *tp, struct ggml_tensor *t)
{
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
        fprintf(stderr, "mtmd_embed: tap %s is not contiguous f32, not written\n", t->name);
        return;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/chunk_%03zu.%s.npy", tp->outdir, tp->chunk, t->name);
    FILE *probe = fopen(path, "rb");
    if (probe) { /* a tensor read by several nodes: written once */
        fclose(probe);
        return;
    }
    const size_t n = (size_t)ggml_nelements(t);
    float *x = malloc(n * sizeof *x);
    if (!x) {
        tp->failed = 1;
        return;
    }
    ggml_backend_tensor_get(t, x, 0, n * sizeof *x);
    size_t shape[4] = {(size_t)t->ne[3], (size_t)t->ne[2], (size_t)t->ne[1], (size_t)t->ne[0]};
    if (write_npy_nd(path, x, shape, 4) != 0)
        tp->failed = 1;
    free(x);
}

static bool tap_cb(struct ggml_tensor *t, bool ask, void *ud)
{
    taps *tp = ud;
    if (!tp->on)
        return ask ? false : true;
    const int want = tap_wanted(tp, t->name), raw = tap_wanted(tp, "inp_raw") && tap_inp_raw(t);
    if (ask)
        return want || raw;
    if (raw)
        tap_write(tp, tap_inp_raw(t));
    if (want)
        tap_write(tp, t);
    return true;
}

/* s as a JSON string body (quotes, backslashes and control bytes escaped). */
static void json_str(FILE *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
}

int main(int argc, char **argv)
{
    if (argc < 6 || argc > 8) {
        fprintf(stderr, "usage: mtmd_embed MODEL MMPROJ IMAGE PROMPT OUTDIR [N_NEW [THREADS]]\n");
        return 2;
    }
    const char *model_path = argv[1], *mmproj = argv[2], *image = argv[3], *prompt = argv[4], *outdir = argv[5];
    const int n_new = argc > 6 ? atoi(argv[6]) : 0, threads = argc > 7 ? atoi(argv[7]) : 2;
    llama_log_set(quiet, NULL);
    mtmd_helper_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) {
        fprintf(stderr, "mtmd_embed: cannot load %s\n", model_path);
        return 1;
    }
    struct mtmd_context_params mcp = mtmd_context_params_default();
    mcp.use_gpu = false;
    mcp.n_threads = threads;
    mcp.print_timings = false;
    mcp.warmup = false;
    taps tp = {.names = getenv("PD_MTMD_TAPS"), .outdir = outdir};
    if (tp.names && *tp.names) {
        mcp.cb_eval = tap_cb;
        mcp.cb_eval_user_data = &tp;
    }
    mtmd_context *mctx = mtmd_init_from_file(mmproj, model, mcp);
    if (!mctx) {
        fprintf(stderr, "mtmd_embed: mtmd_init_from_file refused %s\n", mmproj);
        return 1;
    }
    struct mtmd_helper_bitmap_wrapper bw =
        mtmd_helper_bitmap_init_from_file(mctx, image, false, mtmd_helper_init_opt_default());
    if (!bw.bitmap) {
        fprintf(stderr, "mtmd_embed: cannot read image %s\n", image);
        return 1;
    }
    const char *marker = mtmd_default_marker();
    char *text = malloc(strlen(marker) + strlen(prompt) + 1);
    if (!text)
        return 1;
    if (strstr(prompt, marker))
        strcpy(text, prompt);
    else
        strcat(strcpy(text, marker), prompt);
    mtmd_input_text in = {.text = text, .text_len = strlen(text), .add_special = true, .parse_special = true};
    mtmd_input_chunks *chunks = mtmd_input_chunks_init();
    const mtmd_bitmap *bms[1] = {bw.bitmap};
    int32_t rc = mtmd_tokenize(mctx, chunks, &in, bms, 1);
    if (rc != 0) {
        fprintf(stderr, "mtmd_embed: mtmd_tokenize returned %d\n", (int)rc);
        return 1;
    }

    char path[4096];
    snprintf(path, sizeof path, "%s/chunks.jsonl", outdir);
    FILE *js = fopen(path, "w");
    if (!js) {
        fprintf(stderr, "mtmd_embed: cannot write %s\n", path);
        return 1;
    }
    const size_t width = (size_t)llama_model_n_embd_inp(model);
    size_t bad_total = 0;
    long pos = 0;
    for (size_t i = 0; i < mtmd_input_chunks_size(chunks); i++) {
        const mtmd_input_chunk *ch = mtmd_input_chunks_get(chunks, i);
        const size_t nt = mtmd_input_chunk_get_n_tokens(ch);
        const long np = (long)mtmd_input_chunk_get_n_pos(ch);
        if (mtmd_input_chunk_get_type(ch) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n = 0;
            const llama_token *t = mtmd_input_chunk_get_tokens_text(ch, &n);
            fprintf(js, "{\"i\":%zu,\"type\":\"text\",\"pos\":%ld,\"n_tokens\":%zu,\"n_pos\":%ld,\"tokens\":[", i, pos, nt, np);
            for (size_t k = 0; k < n; k++)
                fprintf(js, "%s%d", k ? "," : "", (int)t[k]);
            fprintf(js, "]}\n");
            printf("chunk %zu text  pos %ld: %zu tokens\n", i, pos, n);
        } else if (mtmd_input_chunk_get_type(ch) == MTMD_INPUT_CHUNK_TYPE_IMAGE) {
            tp.on = 1;
            tp.chunk = i;
            const int32_t enc = mtmd_encode_chunk(mctx, ch);
            tp.on = 0;
            if (tp.failed) {
                fprintf(stderr, "mtmd_embed: cannot write a tap of chunk %zu\n", i);
                return 1;
            }
            if (enc != 0) {
                fprintf(stderr, "mtmd_embed: mtmd_encode_chunk failed on chunk %zu\n", i);
                return 1;
            }
            const float *e = mtmd_get_output_embd(mctx);
            size_t bad = 0;
            double max_abs = 0.0;
            for (size_t k = 0; k < nt * width; k++) {
                if (!isfinite(e[k]))
                    bad++;
                else if (fabs(e[k]) > max_abs)
                    max_abs = fabs(e[k]);
            }
            bad_total += bad;
            char npy[64];
            snprintf(npy, sizeof npy, "chunk_%03zu.npy", i);
            snprintf(path, sizeof path, "%s/%s", outdir, npy);
            if (write_npy(path, e, nt, width) != 0) {
                fprintf(stderr, "mtmd_embed: cannot write %s\n", path);
                return 1;
            }
            const char *id = mtmd_input_chunk_get_id(ch);
            fprintf(js, "{\"i\":%zu,\"type\":\"image\",\"pos\":%ld,\"n_tokens\":%zu,\"n_pos\":%ld,\"id\":\"", i, pos, nt, np);
            json_str(js, id ? id : "", id ? strlen(id) : 0);
            fprintf(js, "\",\"npy\":\"%s\",\"rows\":%zu,\"width\":%zu,\"nonfinite\":%zu,\"max_abs\":%.9g}\n", npy, nt,
                    width, bad, max_abs);
            printf("chunk %zu image pos %ld: %zu rows x %zu, n_pos %ld, %zu non-finite, max |x| %.4g\n", i, pos, nt,
                   width, np, bad, max_abs);
        } else {
            fprintf(stderr, "mtmd_embed: chunk %zu is neither text nor image\n", i);
            return 1;
        }
        pos += np;
    }

    if (n_new > 0) {
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t)(pos + n_new + 16);
        cp.n_batch = 2048;
        cp.n_threads = threads;
        cp.n_threads_batch = threads;
        cp.no_perf = true;
        struct llama_context *lctx = llama_init_from_model(model, cp);
        llama_pos n_past = 0;
        if (!lctx || mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, (int32_t)cp.n_batch, true, &n_past) != 0) {
            fprintf(stderr, "mtmd_embed: evaluating the prompt failed\n");
            return 1;
        }
        const struct llama_vocab *vocab = llama_model_get_vocab(model);
        const int n_vocab = llama_vocab_n_tokens(vocab);
        llama_token *gen = malloc(sizeof *gen * (size_t)n_new);
        float *margin = malloc(sizeof *margin * (size_t)n_new);
        int n_gen = 0;
        for (; n_gen < n_new; n_gen++) {
            const float *lg = llama_get_logits_ith(lctx, -1);
            int best = 0, second = -1;
            for (int v = 1; v < n_vocab; v++)
                if (lg[v] > lg[best]) {
                    second = best;
                    best = v;
                } else if (second < 0 || lg[v] > lg[second])
                    second = v;
            gen[n_gen] = best;
            margin[n_gen] = lg[best] - lg[second];
            if (llama_vocab_is_eog(vocab, best)) {
                n_gen++;
                break;
            }
            if (n_gen + 1 < n_new) {
                llama_token tok = best;
                if (llama_decode(lctx, llama_batch_get_one(&tok, 1)) != 0) {
                    fprintf(stderr, "mtmd_embed: decode failed at generated token %d\n", n_gen);
                    return 1;
                }
            }
        }
        fprintf(js, "{\"type\":\"generated\",\"tokens\":[");
        for (int k = 0; k < n_gen; k++)
            fprintf(js, "%s%d", k ? "," : "", (int)gen[k]);
        fprintf(js, "],\"margins\":[");
        for (int k = 0; k < n_gen; k++)
            fprintf(js, "%s%.9g", k ? "," : "", (double)margin[k]);
        fprintf(js, "]}\n");
        printf("generated:");
        snprintf(path, sizeof path, "%s/generated.txt", outdir);
        FILE *gt = fopen(path, "wb");
        if (!gt) {
            fprintf(stderr, "mtmd_embed: cannot write %s\n", path);
            return 1;
        }
        for (int k = 0; k < n_gen; k++) {
            char piece[256];
            int n = llama_token_to_piece(vocab, gen[k], piece, sizeof piece, 0, false);
            if (n > 0)
                fwrite(piece, 1, (size_t)n, gt);
            printf(" %d", (int)gen[k]);
        }
        printf("\n");
        if (fclose(gt) != 0) {
            fprintf(stderr, "mtmd_embed: cannot write generated.txt\n");
            return 1;
        }
        free(gen);
        free(margin);
        llama_free(lctx);
    }
    if (fclose(js) != 0) {
        fprintf(stderr, "mtmd_embed: cannot write chunks.jsonl\n");
        return 1;
    }
    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bw.bitmap);
    mtmd_free(mctx);
    free(text);
    llama_model_free(model);
    llama_backend_free();
    if (bad_total) {
        fprintf(stderr, "mtmd_embed: %zu non-finite embedding values\n", bad_total);
        return 3;
    }
    return 0;
}

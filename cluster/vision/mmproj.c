/* mmproj: what pipedec reads of a vision projector file (see mmproj.h). */
#include "cluster/vision/mmproj.h"

#include <inttypes.h>
#include <string.h>

#include "cluster/format/gguf.h"
#include "cluster/model/model.h"

static bool get_str(const gguf_file *f, const char *key, const char **s, size_t *len)
{
    pd_err e = {0};
    return gguf_get_str(f, key, s, len, &e) == PD_OK;
}

bool mmproj_is(const gguf_file *f)
{
    const char *s = NULL;
    size_t n = 0;
    return get_str(f, "clip.projector_type", &s, &n) || get_str(f, "clip.vision.projector_type", &s, &n) ||
           (get_str(f, "general.architecture", &s, &n) && n == 4 && !memcmp(s, "clip", 4));
}

/* An optional u32 key: 0 when absent or not a u32 (the description reports
 * what is there; the loader that needs a key checks it). */
static uint32_t opt_u32(const gguf_file *f, const char *key)
{
    uint32_t v = 0;
    pd_err e = {0};
    return gguf_get_u32(f, key, &v, &e) == PD_OK ? v : 0;
}

pd_status mmproj_describe(const gguf_file *f, const char *path, mmproj_info *out, pd_err *err)
{
    mmproj_info m = {0};
    bool hv = false;
    pd_err e = {0};
    m.has_vision = gguf_get_bool(f, "clip.has_vision_encoder", &hv, &e) == PD_OK && hv;
    m.image_size = opt_u32(f, "clip.vision.image_size");
    m.patch_size = opt_u32(f, "clip.vision.patch_size");
    m.clip_width = opt_u32(f, "clip.vision.embedding_length");
    m.clip_layers = opt_u32(f, "clip.vision.block_count");
    m.clip_heads = opt_u32(f, "clip.vision.attention.head_count");
    m.sam_width = opt_u32(f, "clip.vision.sam.embedding_length");
    m.sam_layers = opt_u32(f, "clip.vision.sam.block_count");
    m.sam_heads = opt_u32(f, "clip.vision.sam.head_count");
    m.window = opt_u32(f, "clip.vision.window_size");
    const gguf_tensor *fc = gguf_tensor_find(f, "mm.model.fc.weight");
    if (fc && fc->n_dims == 2) {
        m.fc_in = fc->ne[0];
        m.width = fc->ne[1];
    }
    const char *pt = NULL;
    size_t pl = 0;
    pd_status st = PD_OK;
    if (!get_str(f, "clip.projector_type", &pt, &pl) && !get_str(f, "clip.vision.projector_type", &pt, &pl)) {
        st = pd_err_set(err, PD_ERR_FORMAT, "%s: no clip.projector_type: not an mmproj file", path);
    } else {
        size_t n = pl < sizeof m.projector - 1 ? pl : sizeof m.projector - 1;
        memcpy(m.projector, pt, n);
        m.projector[n] = '\0';
        m.known = (pl == 11 && !memcmp(pt, "deepseekocr", 11)) || (pl == 12 && !memcmp(pt, "deepseekocr2", 12));
        if (!m.known)
            st = pd_err_set(err, PD_ERR_UNSUPPORTED,
                            "%s: projector type \"%.*s\": pipedec reads DeepSeek-OCR's (deepseekocr, deepseekocr2)",
                            path, (int)(pl > 64 ? 64 : pl), pt);
        else if (!fc || fc->n_dims != 2)
            st = pd_err_set(err, PD_ERR_FORMAT, "%s: tensor mm.model.fc.weight %s", path,
                            fc ? "is not a matrix" : "is missing");
    }
    *out = m;
    return st;
}

/* The row width of the mmproj's projector against the model's hidden size.
 * mtmd checks it only against a fully loaded model (the vocabulary-only one
 * here has no width), and a wrong width would make every row read misaligned,
 * so pipedec reads it from the files: for the DeepSeek-OCR projectors it is
 * the output dimension of mm.model.fc.weight (clip_n_mmproj_embd). */
pd_status mmproj_check(const char *mmproj, const char *model_path, uint32_t *width, pd_err *err)
{
    model_hparams hp;
    pd_status st = model_read_hparams(model_path, &hp, err);
    if (st != PD_OK)
        return st;
    gguf_file *f = NULL;
    if ((st = gguf_open(mmproj, &f, err)) != PD_OK) {
        pd_err_prefix(err, "mmproj");
        return st;
    }
    mmproj_info m;
    st = mmproj_describe(f, mmproj, &m, err);
    if (st == PD_OK && m.width != hp.hidden)
        st = pd_err_set(err, PD_ERR_MISMATCH, "the mmproj %s makes rows %" PRIu64
                        " wide (mm.model.fc.weight), the model %s has hidden size %" PRIu32,
                        mmproj, m.width, model_path, hp.hidden);
    else if (st == PD_OK)
        *width = hp.hidden;
    gguf_close(f);
    return st;
}

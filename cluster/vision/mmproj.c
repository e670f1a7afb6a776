/* mmproj: what pipedec reads of a vision projector file (see mmproj.h). */
#include "cluster/vision/mmproj.h"

#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include "cluster/format/gguf.h"
#include "cluster/model/model.h"

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
    const char *pt = NULL;
    size_t pl = 0;
    pd_err e = {0};
    if (gguf_get_str(f, "clip.projector_type", &pt, &pl, &e) != PD_OK &&
        gguf_get_str(f, "clip.vision.projector_type", &pt, &pl, &e) != PD_OK) {
        gguf_close(f);
        return pd_err_set(err, PD_ERR_FORMAT, "%s: no clip.projector_type: not "
                          "an mmproj file", mmproj);
    }
    bool known = (pl == 11 && !memcmp(pt, "deepseekocr", 11)) ||
                 (pl == 12 && !memcmp(pt, "deepseekocr2", 12));
    const gguf_tensor *fc = known ? gguf_tensor_find(f, "mm.model.fc.weight") : NULL;
    if (!known)
        st = pd_err_set(err, PD_ERR_UNSUPPORTED, "%s: projector type \"%.*s\": "
                        "pipedec reads DeepSeek-OCR's (deepseekocr, deepseekocr2)", mmproj,
                        (int)(pl > 64 ? 64 : pl), pt);
    else if (!fc || fc->n_dims != 2)
        st = pd_err_set(err, PD_ERR_FORMAT, "%s: tensor mm.model.fc.weight %s",
                        mmproj, fc ? "is not a matrix" : "is missing");
    else if (fc->ne[1] != hp.hidden)
        st = pd_err_set(err, PD_ERR_MISMATCH, "the mmproj %s makes rows %" PRIu64
                        " wide (mm.model.fc.weight), the model %s has hidden size %" PRIu32,
                        mmproj, fc->ne[1], model_path, hp.hidden);
    else
        *width = hp.hidden;
    gguf_close(f);
    return st;
}


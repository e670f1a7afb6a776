/* ocrmeta: a model's OCR page layout (ocrmeta.h). */
#include "cluster/cli/ocrmeta.h"

#include "cluster/format/gguf.h"
#include "cluster/model/model.h"

#include <string.h>

pd_status ocrmeta_read(const char *model_path, ocrmeta *out, pd_err *err)
{
    model_hparams hp;
    pd_status st = model_read_hparams(model_path, &hp, err);
    if (st != PD_OK)
        return st;
    ocrmeta m = {.hidden = hp.hidden, .vocab = hp.vocab, .bos = hp.bos, .eos = hp.eos,
                 .cells = RENDER_DEFAULT_CELLS};
    gguf_file *f = NULL;
    if ((st = gguf_open(model_path, &f, err)))
        return st;
    if (gguf_find_key(f, OCRMETA_KEY_CELLS) >= 0) {
        st = gguf_get_u32(f, OCRMETA_KEY_CELLS, &m.cells, err);
        if (st == PD_OK && (m.cells < 1 || m.cells > (1u << 16)))
            st = pd_err_set(err, PD_ERR_RANGE, "%s: %s %u out of range 1..65536", model_path, OCRMETA_KEY_CELLS,
                            m.cells);
    }
    if (st == PD_OK && gguf_find_key(f, OCRMETA_KEY_PROMPT) >= 0) {
        gguf_vtype et;
        uint64_t count;
        const void *data;
        st = gguf_get_arr(f, OCRMETA_KEY_PROMPT, &et, &count, &data, err);
        if (st == PD_OK && (et != GGUF_VTYPE_INT32 || count > RENDER_MAX_PROMPT))
            st = pd_err_set(err, PD_ERR_FORMAT, "%s: %s: expected at most %u int32 values", model_path,
                            OCRMETA_KEY_PROMPT, RENDER_MAX_PROMPT);
        for (uint64_t i = 0; st == PD_OK && i < count; i++) {
            int32_t t = gguf_arr_i32_at(data, i);
            if (t < 0 || (uint32_t)t >= hp.vocab)
                st = pd_err_set(err, PD_ERR_RANGE, "%s: %s[%llu] = %d outside the vocabulary of %u", model_path,
                                OCRMETA_KEY_PROMPT, (unsigned long long)i, t, hp.vocab);
            else
                m.prompt[m.n_prompt++] = (uint32_t)t;
        }
    } else if (st == PD_OK && hp.vocab_kind == MODEL_VOCAB_GPT2 && hp.vocab >= 256 && hp.bos >= 256) {
        const char *p = "OCR:";
        for (size_t i = 0; p[i]; i++)
            m.prompt[m.n_prompt++] = (uint8_t)p[i];
    }
    gguf_close(f);
    if (st == PD_OK)
        *out = m;
    return st;
}

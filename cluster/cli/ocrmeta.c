/* ocrmeta: a model's OCR page layout (ocrmeta.h). */
#include "cluster/cli/ocrmeta.h"

#include "cluster/format/gguf.h"
#include "cluster/format/tokenizer.h"
#include "cluster/format/vocab.h"
#include "cluster/model/model.h"

#include <stdlib.h>
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

pd_status ocrmeta_prompt_text(const char *model_path, const ocrmeta *m, char **text, pd_err *err)
{
    *text = NULL;
    if (m->n_prompt == 0)
        return pd_err_set(err, PD_ERR_UNSUPPORTED, "%s names no prompt", model_path);
    gguf_file *f = NULL;
    tok *t = NULL;
    vocab *v = NULL;
    char *buf = NULL;
    int32_t *ids = NULL;
    size_t len = 0, n = 0;
    pd_status st = gguf_open(model_path, &f, err);
    if (st == PD_OK)
        st = tok_new_gguf(f, &t, err);
    if (st == PD_OK)
        st = tok_vocab_new(t, true, &v, err);
    if (st == PD_OK && !(buf = malloc(m->n_prompt * vocab_max_piece(v) + 1)))
        st = pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; st == PD_OK && i < m->n_prompt; i++) {
        size_t pl = 0;
        const char *p = vocab_piece(v, (int32_t)m->prompt[i], &pl);
        memcpy(buf + len, p, pl);
        len += pl;
    }
    if (st == PD_OK) {
        buf[len] = 0;
        tok_opts o = {.add_special = false, .parse_special = true};
        if (len == 0 || tok_encode(t, buf, len, o, &ids, &n, err) != PD_OK)
            st = pd_err_set(err, PD_ERR_MISMATCH, "the prompt's pieces are no text the tokenizer takes");
        else if (n != m->n_prompt)
            st = pd_err_set(err, PD_ERR_MISMATCH, "the prompt's text tokenizes to %zu ids, the prompt has %u", n,
                            m->n_prompt);
        for (size_t i = 0; st == PD_OK && i < n; i++)
            if (ids[i] != (int32_t)m->prompt[i])
                st = pd_err_set(err, PD_ERR_MISMATCH, "the prompt's text tokenizes to id %d at %zu, the prompt has %u",
                                ids[i], i, m->prompt[i]);
    }
    if (st != PD_OK)
        pd_err_prefix(err, "%s", model_path);
    else
        *text = buf, buf = NULL;
    free(ids);
    free(buf);
    vocab_free(v);
    tok_free(t);
    gguf_close(f);
    return st;
}

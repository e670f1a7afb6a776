/* outfile: resumable JSON Lines output (format and crash rules in outfile.h).
 * Owns the locked O_APPEND descriptor, the set of ids already written and a
 * reusable line buffer. */
#include "cluster/format/outfile.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/check.h"
#include "base/file.h"
#include "base/fnv.h"
#include "base/utf8.h"
#include "comm/rd.h"

/* INV: size == the file's length (we are its only writer: flock);
 *      ids is an open-addressing set of n distinct strings, cap a power of
 *      two (or 0) with 2 * n <= cap. */
struct outfile {
    int fd;
    char *path;
    uint64_t size;
    uint64_t cut;
    char **ids;
    size_t n, cap;
    char *buf; /* line buffer */
    size_t buf_cap;
    size_t n_error_lines; /* lines of failed pages (in the file or written since) */
};

/* ---- id set ---------------------------------------------------------------- */

static size_t outfile_slot(char *const *ids, size_t cap, const char *id)
{
    size_t i = (size_t)pd_fnv_str(id) & (cap - 1);
    while (ids[i] && strcmp(ids[i], id) != 0)
        i = (i + 1) & (cap - 1);
    return i;
}

bool outfile_has(const outfile *o, const char *id)
{
    if (!o || !id || !o->cap)
        return false;
    return o->ids[outfile_slot(o->ids, o->cap, id)] != NULL;
}

/* Adds id (copied) unless present; -1 on no memory. */
static int outfile_add(outfile *o, const char *id)
{
    if (outfile_has(o, id))
        return 0;
    if (2 * (o->n + 1) > o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 64;
        char **ni = calloc(nc, sizeof *ni);
        if (!ni)
            return -1;
        for (size_t i = 0; i < o->cap; i++)
            if (o->ids[i])
                ni[outfile_slot(ni, nc, o->ids[i])] = o->ids[i];
        free(o->ids);
        o->ids = ni;
        o->cap = nc;
    }
    char *copy = strdup(id);
    if (!copy)
        return -1;
    o->ids[outfile_slot(o->ids, o->cap, id)] = copy;
    o->n++;
    return 0;
}

/* ---- open ------------------------------------------------------------------- */

static bool outfile_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

/* Checks one complete line (without its '\n') and records its id. */
static pd_status outfile_take_line(outfile *o, const char *line, size_t len, uint64_t lineno,
                                   pd_err *err)
{
    if (outfile_blank(line, len))
        return PD_OK;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    pd_status st = PD_OK;
    if (!root || !outfile_blank(end, len - (size_t)(end - line))) {
        st = pd_err_set(err, PD_ERR_FORMAT,
                        "outfile: %s:%" PRIu64 ": not valid JSON; refusing to append to a corrupt "
                        "file (fix or remove that line)", o->path, lineno);
    } else {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "id");
        if (!cJSON_IsObject(root) || !cJSON_IsString(id) || !id->valuestring ||
            !id->valuestring[0])
            st = pd_err_set(err, PD_ERR_FORMAT,
                            "outfile: %s:%" PRIu64 ": not a JSON object with a string \"id\"; "
                            "refusing to append to a corrupt file (fix or remove that line)",
                            o->path, lineno);
        else if (cJSON_GetObjectItemCaseSensitive(root, "error"))
            o->n_error_lines++; /* a page that failed: not done, a rerun retries it */
        else if (outfile_add(o, id->valuestring) != 0)
            st = pd_err_set(err, PD_ERR_NOMEM, "outfile: %s: no memory", o->path);
    }
    cJSON_Delete(root);
    return st;
}

/* Reads the file, records ids; *good = length of the complete lines. */
static pd_status outfile_scan(outfile *o, uint64_t size, uint64_t *good, pd_err *err)
{
    enum { CHUNK = 1 << 16 };
    char *chunk = malloc(CHUNK);
    char *line = NULL;
    size_t line_len = 0, line_cap = 0;
    uint64_t off = 0, lineno = 0;
    pd_status st = chunk ? PD_OK : pd_err_set(err, PD_ERR_NOMEM, "outfile: no memory");
    *good = 0;
    while (st == PD_OK && off < size) {
        size_t want = size - off < CHUNK ? (size_t)(size - off) : CHUNK;
        ssize_t r = pread(o->fd, chunk, want, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            st = pd_err_set(err, PD_ERR_IO, "outfile: %s: offset %" PRIu64 ": read: %s", o->path,
                            off, r < 0 ? strerror(errno) : "file shrank");
            break;
        }
        /* Lines are cut out of the chunk by comm/rd.h's reader (base = the
         * chunk's file offset); a line may continue into the next chunk. */
        rd cr;
        rd_init(&cr, chunk, (size_t)r, (size_t)off, o->path, err);
        while (st == PD_OK && rd_remaining(&cr)) {
            const uint8_t *piece = NULL;
            size_t take = 0;
            bool nl = false;
            if ((st = rd_until(&cr, '\n', &piece, &take, &nl)) != PD_OK)
                break;
            if (line_len + take + 1 > line_cap) {
                size_t nc = line_cap ? line_cap : 4096;
                while (nc < line_len + take + 1)
                    nc *= 2;
                char *nb = realloc(line, nc);
                if (!nb) {
                    st = pd_err_set(err, PD_ERR_NOMEM, "outfile: no memory for a line");
                    break;
                }
                line = nb;
                line_cap = nc;
            }
            memcpy(line + line_len, piece, take);
            line_len += take;
            if (nl) {
                lineno++;
                st = outfile_take_line(o, line, line_len, lineno, err);
                *good = rd_offset(&cr);
                line_len = 0;
            }
        }
        off += (uint64_t)r;
    }
    free(chunk);
    free(line);
    return st;
}

pd_status outfile_open(const char *path, outfile **out, pd_err *err)
{
    if (!path || !*path || !out)
        return pd_err_set(err, PD_ERR_ARG, "outfile: empty path or NULL output");
    outfile *o = calloc(1, sizeof *o);
    if (!o || !(o->path = strdup(path))) {
        free(o);
        return pd_err_set(err, PD_ERR_NOMEM, "outfile: no memory");
    }
    o->fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (o->fd < 0) {
        pd_status st = pd_err_set(err, PD_ERR_IO, "outfile: %s: cannot open: %s", path,
                                  strerror(errno));
        free(o->path);
        free(o);
        return st;
    }
    pd_status st = PD_OK;
    uint64_t size = 0;
    if (flock(o->fd, LOCK_EX | LOCK_NB) != 0)
        st = errno == EWOULDBLOCK
                 ? pd_err_set(err, PD_ERR_REFUSED, "outfile: %s: in use by another run (locked)",
                              path)
                 : pd_err_set(err, PD_ERR_IO, "outfile: %s: lock: %s", path, strerror(errno));
    else
        st = pd_file_check_regular(o->fd, path, "outfile", &size, err);
    uint64_t good = 0;
    if (st == PD_OK)
        st = outfile_scan(o, size, &good, err);
    if (st == PD_OK && good < size) {
        /* A killed run's partial last line: cut it so appends start clean. */
        if (ftruncate(o->fd, (off_t)good) != 0 || fsync(o->fd) != 0)
            st = pd_err_set(err, PD_ERR_IO, "outfile: %s: cutting a partial last line: %s", path,
                            strerror(errno));
        else
            o->cut = size - good;
    }
    if (st != PD_OK) {
        outfile_free(o);
        return st;
    }
    o->size = good;
    *out = o;
    return PD_OK;
}

void outfile_free(outfile *o)
{
    if (!o)
        return;
    if (o->fd >= 0)
        close(o->fd); /* releases the lock */
    for (size_t i = 0; i < o->cap; i++)
        free(o->ids[i]);
    free(o->ids);
    free(o->buf);
    free(o->path);
    free(o);
}

size_t outfile_count(const outfile *o) { return o ? o->n : 0; }

uint64_t outfile_cut_bytes(const outfile *o) { return o ? o->cut : 0; }

size_t outfile_error_lines(const outfile *o) { return o ? o->n_error_lines : 0; }

uint64_t outfile_size(const outfile *o) { return o ? o->size : 0; }

/* ---- write ------------------------------------------------------------------- */

/* A growing byte string over the outfile's reusable buffer. */
typedef struct outfile_sb {
    outfile *o;
    size_t len;
    bool oom;
} outfile_sb;

static void outfile_put(outfile_sb *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (n > b->o->buf_cap - b->len) {
        size_t nc = b->o->buf_cap ? b->o->buf_cap : 4096;
        while (nc - b->len < n) {
            if (nc > SIZE_MAX / 2) {
                b->oom = true;
                return;
            }
            nc *= 2;
        }
        char *nb = realloc(b->o->buf, nc);
        if (!nb) {
            b->oom = true;
            return;
        }
        b->o->buf = nb;
        b->o->buf_cap = nc;
    }
    memcpy(b->o->buf + b->len, s, n);
    b->len += n;
}

static void outfile_puts(outfile_sb *b, const char *s) { outfile_put(b, s, strlen(s)); }

/* A JSON string literal of s[0..n): escapes, and U+FFFD for each ill-formed
 * subpart (text from vocab is already repaired; this is the last line of
 * defence for callers' text). */
static void outfile_put_json_string(outfile_sb *b, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    outfile_put(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            outfile_put(b, e, 2);
            i++;
        } else if (c < 0x20) {
            char e[8];
            const char *sh = c == '\n' ? "\\n" : c == '\r' ? "\\r" : c == '\t' ? "\\t"
                           : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
            if (!sh) {
                snprintf(e, sizeof e, "\\u%04x", c);
                sh = e;
            }
            outfile_puts(b, sh);
            i++;
        } else {
            size_t bad, k = pd_utf8_decode(u + i, n - i, NULL, &bad);
            if (k) {
                outfile_put(b, s + i, k);
                i += k;
            } else {
                outfile_put(b, "\xef\xbf\xbd", 3);
                i += bad;
            }
        }
    }
    outfile_put(b, "\"", 1);
}

/* Writes the line in b with one write() and fdatasync; records the id as
 * done unless the line reports a failed page. */
static pd_status outfile_emit(outfile *o, outfile_sb *b, const outfile_page *pg, pd_err *err)
{
    if (b->oom)
        return pd_err_set(err, PD_ERR_NOMEM, "outfile: %s: page \"%s\": no memory for the line",
                          o->path, pg->id);
    /* normally one write(); a short one (a full disk writes what fits) is
     * continued, so the failure that follows says why (ENOSPC, EDQUOT ...) */
    size_t done = 0;
    int e = 0;
    while (done < b->len) {
        ssize_t w = write(o->fd, o->buf + done, b->len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            e = w < 0 ? errno : EIO;
            break;
        }
        done += (size_t)w;
    }
    if (done != b->len) {
        /* Never leave a partial line behind: cut back to the last full line. */
        if (done > 0 && ftruncate(o->fd, (off_t)o->size) != 0)
            return pd_err_set(err, PD_ERR_IO,
                              "outfile: %s: page \"%s\": short write and the partial line could "
                              "not be cut: %s", o->path, pg->id, strerror(errno));
        return pd_err_set(err, PD_ERR_IO, "outfile: %s: page \"%s\": write: %s%s", o->path, pg->id, strerror(e),
                          e == ENOSPC || e == EDQUOT ? " (the output keeps every page written before; free space "
                                                       "and rerun to resume)" : "");
    }
    o->size += b->len;
    if (pg->error)
        o->n_error_lines++;
    else if (outfile_add(o, pg->id) != 0)
        return pd_err_set(err, PD_ERR_NOMEM, "outfile: %s: no memory", o->path);
    if (fdatasync(o->fd) != 0)
        return pd_err_set(err, PD_ERR_IO, "outfile: %s: page \"%s\": fdatasync: %s", o->path,
                          pg->id, strerror(errno));
    return PD_OK;
}

pd_status outfile_write_page(outfile *o, const outfile_page *pg, pd_err *err)
{
    if (!o || !pg)
        return pd_err_set(err, PD_ERR_ARG, "outfile: NULL argument");
    if (!pg->id || !pg->id[0])
        return pd_err_set(err, PD_ERR_ARG, "outfile: %s: page without an id", o->path);
    if ((!pg->tokens && pg->n_tokens) || (!pg->text && pg->text_len) ||
        pg->stop >= OUTFILE_STOP_COUNT || (int)pg->stop < 0)
        return pd_err_set(err, PD_ERR_ARG, "outfile: %s: page \"%s\": bad fields", o->path, pg->id);
    size_t bad_at = 0;
    if (!pd_utf8_valid(pg->id, strlen(pg->id), &bad_at))
        return pd_err_set(err, PD_ERR_ARG,
                          "outfile: %s: page id is not valid UTF-8 (byte %zu); it would not "
                          "read back the same on resume", o->path, bad_at);
    if (outfile_has(o, pg->id))
        return pd_err_set(err, PD_ERR_REFUSED, "outfile: %s: page \"%s\" is already written",
                          o->path, pg->id);

    outfile_sb b = {.o = o};
    char num[32];
    outfile_puts(&b, "{\"id\":");
    outfile_put_json_string(&b, pg->id, strlen(pg->id));
    if (pg->error) {
        outfile_puts(&b, ",\"error\":");
        outfile_put_json_string(&b, pg->error, strlen(pg->error));
        outfile_puts(&b, "}\n");
        return outfile_emit(o, &b, pg, err);
    }
    outfile_puts(&b, ",\"tokens\":[");
    for (size_t i = 0; i < pg->n_tokens; i++) {
        int k = snprintf(num, sizeof num, i ? ",%" PRId32 : "%" PRId32, pg->tokens[i]);
        outfile_put(&b, num, (size_t)k);
    }
    outfile_puts(&b, "],\"text\":");
    outfile_put_json_string(&b, pg->text ? pg->text : "", pg->text_len);
    int k = snprintf(num, sizeof num, ",\"prefill_rows\":%" PRIu64, pg->prefill_rows);
    outfile_put(&b, num, (size_t)k);
    k = snprintf(num, sizeof num, ",\"generated\":%" PRIu64, pg->generated);
    outfile_put(&b, num, (size_t)k);
    outfile_puts(&b, pg->stop == OUTFILE_STOP_EOS ? ",\"stop\":\"eos\"" : ",\"stop\":\"length\"");
    if (pg->has_digest) {
        k = snprintf(num, sizeof num, ",\"digest\":\"%016" PRIx64 "\"", pg->digest);
        outfile_put(&b, num, (size_t)k);
    }
    outfile_puts(&b, "}\n");
    return outfile_emit(o, &b, pg, err);
}

void outfile_check(const outfile *o)
{
    CHECK(o && o->fd >= 0);
    CHECK(o->cap == 0 || (o->cap & (o->cap - 1)) == 0);
    CHECK(2 * o->n <= o->cap || o->n == 0);
    size_t n = 0;
    for (size_t i = 0; i < o->cap; i++)
        if (o->ids[i]) {
            n++;
            CHECK(outfile_slot(o->ids, o->cap, o->ids[i]) == i);
        }
    CHECK(n == o->n);
    struct stat sb;
    CHECK(fstat(o->fd, &sb) == 0);
    CHECKF((uint64_t)sb.st_size == o->size, "file %lld bytes, expected %" PRIu64,
           (long long)sb.st_size, o->size);
}

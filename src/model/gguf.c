/* GGUF v2/v3 parser over a borrowed byte buffer (normally an mmap of the file).
 * Every read goes through a bounds-checked cursor, so a truncated or hostile file can only
 * produce an error, never a read outside the buffer. */
#include "model/gguf.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
/* Sanity caps: far above any real model, low enough that a hostile count cannot make us
 * allocate absurd index arrays before the bounds checks catch it. */
#define GGUF_MAX_KV (1u << 20)
#define GGUF_MAX_TENSORS (1u << 20)
#define GGUF_MAX_DIMS 4

typedef struct cursor {
    const unsigned char *p;
    size_t len, off;
    const char *name;
    pgd_err *err;
} cursor;

typedef pgd_name_buf name_buf;
#define pname pgd_str_safe
const char *pgd_str_safe(pgd_str n, pgd_name_buf *b) {
    size_t k = n.len < 64 ? (size_t)n.len : 64;
    for (size_t i = 0; i < k; i++) {
        unsigned char ch = (unsigned char)n.ptr[i];
        b->s[i] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
    }
    strcpy(b->s + k, n.len > 64 ? "..." : "");
    return b->s;
}

static int need(cursor *c, uint64_t n, const char *what) {
    if (n > c->len - c->off)
        return pgd_err_set(c->err, PGD_EFORMAT, "%s: truncated file: %s at offset %zu needs %" PRIu64
                           " bytes, %zu left", c->name, what, c->off, n, c->len - c->off);
    return PGD_OK;
}

#define DEFINE_READ(fn, T)                                                                       \
    static int fn(cursor *c, T *out, const char *what) {                                        \
        int rc = need(c, sizeof(T), what);                                                       \
        if (rc) return rc;                                                                       \
        memcpy(out, c->p + c->off, sizeof(T));                                                   \
        c->off += sizeof(T);                                                                     \
        return PGD_OK;                                                                           \
    }
DEFINE_READ(read_u32, uint32_t)
DEFINE_READ(read_u64, uint64_t)

static int read_str(cursor *c, pgd_str *s, const char *what) {
    uint64_t n;
    int rc = read_u64(c, &n, what);
    if (rc) return rc;
    if ((rc = need(c, n, what))) return rc;
    s->ptr = (const char *)c->p + c->off;
    s->len = n;
    c->off += n;
    return PGD_OK;
}

static size_t vtype_size(uint32_t t) {
    switch (t) {
    case PGD_GGUF_U8: case PGD_GGUF_I8: case PGD_GGUF_BOOL: return 1;
    case PGD_GGUF_U16: case PGD_GGUF_I16: return 2;
    case PGD_GGUF_U32: case PGD_GGUF_I32: case PGD_GGUF_F32: return 4;
    case PGD_GGUF_U64: case PGD_GGUF_I64: case PGD_GGUF_F64: return 8;
    default: return 0;
    }
}

/* Reads a scalar of numeric type t into kv's union. */
static void load_scalar(pgd_gguf_kv *kv, uint32_t t, const unsigned char *p) {
    switch (t) {
    case PGD_GGUF_U8: kv->v.u = p[0]; break;
    case PGD_GGUF_BOOL: kv->v.u = p[0] != 0; break;
    case PGD_GGUF_I8: kv->v.i = (int8_t)p[0]; break;
    case PGD_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); kv->v.u = x; break; }
    case PGD_GGUF_I16: { int16_t x; memcpy(&x, p, 2); kv->v.i = x; break; }
    case PGD_GGUF_U32: { uint32_t x; memcpy(&x, p, 4); kv->v.u = x; break; }
    case PGD_GGUF_I32: { int32_t x; memcpy(&x, p, 4); kv->v.i = x; break; }
    case PGD_GGUF_F32: { float x; memcpy(&x, p, 4); kv->v.f = x; break; }
    case PGD_GGUF_U64: { uint64_t x; memcpy(&x, p, 8); kv->v.u = x; break; }
    case PGD_GGUF_I64: { int64_t x; memcpy(&x, p, 8); kv->v.i = x; break; }
    case PGD_GGUF_F64: { double x; memcpy(&x, p, 8); kv->v.f = x; break; }
    default: break;
    }
}

static int parse_kv(cursor *c, pgd_gguf_kv *kv) {
    name_buf nb;
    int rc = read_str(c, &kv->key, "metadata key");
    if (rc) return rc;
    uint32_t t;
    if ((rc = read_u32(c, &t, "metadata value type"))) return rc;
    kv->type = (pgd_gguf_vtype)t;
    if (t == PGD_GGUF_STRING) return read_str(c, &kv->v.s, "metadata string");
    if (t == PGD_GGUF_ARRAY) {
        uint32_t et;
        uint64_t n;
        if ((rc = read_u32(c, &et, "array element type"))) return rc;
        if ((rc = read_u64(c, &n, "array length"))) return rc;
        kv->arr_type = (pgd_gguf_vtype)et;
        kv->arr_n = n;
        if (et == PGD_GGUF_STRING) {
            /* Each string needs at least its 8-byte length: reject impossible counts before
             * allocating the index. */
            if (n > (c->len - c->off) / 8)
                return pgd_err_set(c->err, PGD_EFORMAT, "%s: array '%s' claims %" PRIu64
                                   " strings, more than the file can hold", c->name,
                                   pname(kv->key, &nb), n);
            kv->arr_str = malloc((n ? n : 1) * sizeof *kv->arr_str);
            if (!kv->arr_str) return pgd_err_set(c->err, PGD_ENOMEM, "%s: out of memory", c->name);
            for (uint64_t i = 0; i < n; i++)
                if ((rc = read_str(c, &kv->arr_str[i], "array string"))) return rc;
            return PGD_OK;
        }
        size_t es = vtype_size(et);
        if (!es)
            return pgd_err_set(c->err, PGD_EFORMAT, "%s: array '%s' has invalid element type %u",
                               c->name, pname(kv->key, &nb), et);
        if (n > (c->len - c->off) / es)
            return pgd_err_set(c->err, PGD_EFORMAT, "%s: truncated file: array '%s' of %" PRIu64
                               " elements", c->name, pname(kv->key, &nb), n);
        kv->arr_data = c->p + c->off;
        c->off += n * es;
        return PGD_OK;
    }
    size_t sz = vtype_size(t);
    if (!sz)
        return pgd_err_set(c->err, PGD_EFORMAT, "%s: metadata '%s' has invalid value type %u",
                           c->name, pname(kv->key, &nb), t);
    if ((rc = need(c, sz, "metadata value"))) return rc;
    load_scalar(kv, t, c->p + c->off);
    c->off += sz;
    return PGD_OK;
}

static int parse_tensor(cursor *c, pgd_gguf_tensor *ti) {
    name_buf nb;
    int rc = read_str(c, &ti->name, "tensor name");
    if (rc) return rc;
    if ((rc = read_u32(c, &ti->n_dims, "tensor dims"))) return rc;
    if (ti->n_dims == 0 || ti->n_dims > GGUF_MAX_DIMS)
        return pgd_err_set(c->err, PGD_EFORMAT, "%s: tensor '%s' has %u dimensions (1..4 allowed)",
                           c->name, pname(ti->name, &nb), ti->n_dims);
    for (int d = 0; d < GGUF_MAX_DIMS; d++) ti->ne[d] = 1;
    for (uint32_t d = 0; d < ti->n_dims; d++)
        if ((rc = read_u64(c, &ti->ne[d], "tensor shape"))) return rc;
    uint32_t t;
    if ((rc = read_u32(c, &t, "tensor type"))) return rc;
    ti->type = (pgd_type)t;
    if ((rc = read_u64(c, &ti->offset, "tensor offset"))) return rc;
    if (!pgd_type_block_elems(ti->type))
        return pgd_err_set(c->err, PGD_EUNSUPPORTED, "%s: tensor '%s' has unknown tensor type %u",
                           c->name, pname(ti->name, &nb), t);
    /* Element count with overflow checks: each dim < 2^40 and the product < 2^50. */
    uint64_t nel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        if (ti->ne[d] == 0 || ti->ne[d] > (1ull << 40) || nel > (1ull << 50) / ti->ne[d])
            return pgd_err_set(c->err, PGD_EFORMAT, "%s: tensor '%s' has an invalid shape",
                               c->name, pname(ti->name, &nb));
        nel *= ti->ne[d];
    }
    uint64_t row = pgd_type_row_bytes(ti->type, ti->ne[0]);
    if (!row)
        return pgd_err_set(c->err, PGD_EFORMAT, "%s: tensor '%s': row of %" PRIu64
                           " elements is not a multiple of the %s block size", c->name,
                           pname(ti->name, &nb), ti->ne[0], pgd_type_name(ti->type));
    ti->nbytes = row * (nel / ti->ne[0]);
    return PGD_OK;
}

int pgd_gguf_parse(pgd_gguf *g, const void *buf, size_t len, const char *name, pgd_err *err) {
    memset(g, 0, sizeof *g);
    g->path = name;
    cursor c = {.p = buf, .len = len, .off = 0, .name = name, .err = err};
    uint32_t magic;
    int rc;
    name_buf nb;
    if (len < 4 || (memcpy(&magic, buf, 4), magic != GGUF_MAGIC)) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: not a GGUF file (bad magic)", name);
        goto fail;
    }
    c.off = 4;
    if ((rc = read_u32(&c, &g->version, "version"))) goto fail;
    if (g->version != 2 && g->version != 3) {
        rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: unsupported GGUF version %u (2 and 3 are)",
                         name, g->version);
        goto fail;
    }
    if ((rc = read_u64(&c, &g->n_tensors, "tensor count"))) goto fail;
    if ((rc = read_u64(&c, &g->n_kv, "metadata count"))) goto fail;
    if (g->n_kv > GGUF_MAX_KV || g->n_tensors > GGUF_MAX_TENSORS) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: implausible counts (%" PRIu64 " tensors, %" PRIu64
                         " metadata entries)", name, g->n_tensors, g->n_kv);
        goto fail;
    }
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", name);
        goto fail;
    }
    for (uint64_t i = 0; i < g->n_kv; i++)
        if ((rc = parse_kv(&c, &g->kv[i]))) goto fail;

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const pgd_gguf_kv *al = pgd_gguf_find(g, "general.alignment");
    if (al) {
        if (al->type != PGD_GGUF_U32 || al->v.u == 0 || (al->v.u & (al->v.u - 1)) ||
            al->v.u > 65536) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: invalid general.alignment", name);
            goto fail;
        }
        g->alignment = al->v.u;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((rc = parse_tensor(&c, &g->tensors[i]))) goto fail;

    size_t data_off = (c.off + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors > 0 && data_off > len) {
        rc = pgd_err_set(err, PGD_EFORMAT, "%s: truncated file: no tensor data section", name);
        goto fail;
    }
    g->data = (const unsigned char *)buf + (data_off <= len ? data_off : len);
    uint64_t data_len = data_off <= len ? len - data_off : 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        pgd_gguf_tensor *ti = &g->tensors[i];
        if (ti->offset % g->alignment) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: tensor '%s' offset %" PRIu64
                             " is not aligned to %" PRIu64, name, pname(ti->name, &nb),
                             ti->offset, g->alignment);
            goto fail;
        }
        if (ti->offset > data_len || ti->nbytes > data_len - ti->offset) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: tensor '%s' (offset %" PRIu64 ", %" PRIu64
                             " bytes) lies outside the file (truncated?)", name, pname(ti->name, &nb), ti->offset, ti->nbytes);
            goto fail;
        }
        ti->data = g->data + ti->offset;
    }
    return PGD_OK;
fail:
    pgd_gguf_close(g);
    g->path = name;
    return rc;
}

int pgd_gguf_open(pgd_gguf *g, const char *path, pgd_err *err) {
    pgd_mapfile m;
    int rc = pgd_mapfile_open(&m, path, err);
    if (rc) {
        memset(g, 0, sizeof *g);
        return rc;
    }
    rc = pgd_gguf_parse(g, m.data, m.size, path, err);
    if (rc) {
        pgd_mapfile_close(&m);
        return rc;
    }
    g->map = m;
    return PGD_OK;
}

void pgd_gguf_close(pgd_gguf *g) {
    if (g->kv)
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].arr_str);
    free(g->kv);
    free(g->tensors);
    pgd_mapfile_close(&g->map);
    memset(g, 0, sizeof *g);
}

bool pgd_str_eq(pgd_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && memcmp(s.ptr, cstr, n) == 0;
}

const pgd_gguf_kv *pgd_gguf_find(const pgd_gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (pgd_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const pgd_gguf_tensor *pgd_gguf_find_tensor(const pgd_gguf *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (pgd_str_eq(g->tensors[i].name, name)) return &g->tensors[i];
    return NULL;
}

static bool is_unsigned(pgd_gguf_vtype t) {
    return t == PGD_GGUF_U8 || t == PGD_GGUF_U16 || t == PGD_GGUF_U32 || t == PGD_GGUF_U64;
}
static bool is_signed(pgd_gguf_vtype t) {
    return t == PGD_GGUF_I8 || t == PGD_GGUF_I16 || t == PGD_GGUF_I32 || t == PGD_GGUF_I64;
}

int pgd_gguf_get_u32(const pgd_gguf *g, const char *key, uint32_t *out) {
    const pgd_gguf_kv *kv = pgd_gguf_find(g, key);
    if (!kv) return PGD_ENOENT;
    if (is_unsigned(kv->type) && kv->v.u <= UINT32_MAX) *out = (uint32_t)kv->v.u;
    else if (is_signed(kv->type) && kv->v.i >= 0 && kv->v.i <= (int64_t)UINT32_MAX)
        *out = (uint32_t)kv->v.i;
    else return PGD_EFORMAT;
    return PGD_OK;
}

int pgd_gguf_get_f32(const pgd_gguf *g, const char *key, float *out) {
    const pgd_gguf_kv *kv = pgd_gguf_find(g, key);
    if (!kv) return PGD_ENOENT;
    if (kv->type == PGD_GGUF_F32 || kv->type == PGD_GGUF_F64) *out = (float)kv->v.f;
    else if (is_unsigned(kv->type)) *out = (float)kv->v.u;
    else if (is_signed(kv->type)) *out = (float)kv->v.i;
    else return PGD_EFORMAT;
    return PGD_OK;
}

int pgd_gguf_get_bool(const pgd_gguf *g, const char *key, bool *out) {
    const pgd_gguf_kv *kv = pgd_gguf_find(g, key);
    if (!kv) return PGD_ENOENT;
    if (kv->type == PGD_GGUF_BOOL || is_unsigned(kv->type)) *out = kv->v.u != 0;
    else if (is_signed(kv->type)) *out = kv->v.i != 0;
    else return PGD_EFORMAT;
    return PGD_OK;
}

int pgd_gguf_get_str(const pgd_gguf *g, const char *key, pgd_str *out) {
    const pgd_gguf_kv *kv = pgd_gguf_find(g, key);
    if (!kv) return PGD_ENOENT;
    if (kv->type != PGD_GGUF_STRING) return PGD_EFORMAT;
    *out = kv->v.s;
    return PGD_OK;
}

int pgd_gguf_get_arr(const pgd_gguf *g, const char *key, pgd_gguf_vtype elem,
                     const pgd_gguf_kv **out) {
    const pgd_gguf_kv *kv = pgd_gguf_find(g, key);
    if (!kv) return PGD_ENOENT;
    if (kv->type != PGD_GGUF_ARRAY || kv->arr_type != elem) return PGD_EFORMAT;
    *out = kv;
    return PGD_OK;
}

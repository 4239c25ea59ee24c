/* safetensors: an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
 * shape and [begin, end) byte range within the data section, then the data. */
#include "model/safetensors.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/xalloc.h"

#define ST_MAX_HEADER (100u << 20) /* the format's own reference implementation caps at 100 MB */

static int add_tensor(pgd_safetensors *st, size_t *cap, pgd_st_tensor *t, const char *name,
                      pgd_err *err) {
    if (pgd_grow(&st->tensors, st->n_tensors, cap, 64, sizeof *st->tensors))
        return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", name);
    st->tensors[st->n_tensors++] = *t;
    return PGD_OK;
}

static int parse_dtype(const char *s, pgd_type *t) {
    if (!strcmp(s, "F32")) *t = PGD_TYPE_F32;
    else if (!strcmp(s, "F16")) *t = PGD_TYPE_F16;
    else if (!strcmp(s, "BF16")) *t = PGD_TYPE_BF16;
    else return PGD_EUNSUPPORTED;
    return PGD_OK;
}

/* A JSON key made safe for a one-line message. */
static const char *safe_key(const char *k, pgd_name_buf *b) {
    return pgd_str_safe((pgd_str){k, strlen(k)}, b);
}

int pgd_st_parse(pgd_safetensors *st, const void *buf, size_t len, const char *name, pgd_err *err) {
    const unsigned char *p = buf;
    if (len < 8) return pgd_err_set(err, PGD_EFORMAT, "%s: truncated safetensors file", name);
    uint64_t hlen;
    memcpy(&hlen, p, 8);
    if (hlen > ST_MAX_HEADER || hlen > len - 8)
        return pgd_err_set(err, PGD_EFORMAT, "%s: safetensors header length %" PRIu64
                           " exceeds the file (%zu bytes)", name, hlen, len);
    const unsigned char *data = p + 8 + hlen;
    uint64_t data_len = len - 8 - hlen;
    cJSON *root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return pgd_err_set(err, PGD_EFORMAT, "%s: safetensors header is not a JSON object", name);
    }
    size_t cap = st->n_tensors; /* st->tensors was sized exactly so far */
    int rc = PGD_OK;
    cJSON *e;
    cJSON_ArrayForEach(e, root) {
        pgd_name_buf nb, nb2;
        if (!strcmp(e->string, "__metadata__")) continue;
        pgd_st_tensor t = {0};
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
        cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
            cJSON_GetArraySize(off) != 2) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: tensor '%s' lacks dtype/shape/data_offsets",
                             name, safe_key(e->string, &nb));
            break;
        }
        if (parse_dtype(dt->valuestring, &t.type)) {
            rc = pgd_err_set(err, PGD_EUNSUPPORTED, "%s: tensor '%s' has unsupported dtype %s "
                             "(F32, F16 and BF16 are)", name, safe_key(e->string, &nb),
                             safe_key(dt->valuestring, &nb2));
            break;
        }
        int nd = cJSON_GetArraySize(sh);
        if (nd > 4) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: tensor '%s' has %d dimensions", name,
                             safe_key(e->string, &nb), nd);
            break;
        }
        t.n_dims = (uint32_t)nd;
        uint64_t nel = 1;
        bool bad = false;
        for (int d = 0; d < nd; d++) {
            cJSON *x = cJSON_GetArrayItem(sh, d);
            double v = cJSON_IsNumber(x) ? x->valuedouble : -1;
            if (v < 0 || v > (double)(1ull << 40) || v != (double)(uint64_t)v) {
                bad = true;
                break;
            }
            t.shape[d] = (uint64_t)v;
            if (t.shape[d] && nel > (1ull << 50) / t.shape[d]) {
                bad = true;
                break;
            }
            nel *= t.shape[d];
        }
        double b = cJSON_IsNumber(cJSON_GetArrayItem(off, 0)) ? cJSON_GetArrayItem(off, 0)->valuedouble : -1;
        double en = cJSON_IsNumber(cJSON_GetArrayItem(off, 1)) ? cJSON_GetArrayItem(off, 1)->valuedouble : -1;
        uint64_t esz = t.type == PGD_TYPE_F32 ? 4 : 2;
        if (bad || b < 0 || en < b || en > (double)data_len || (uint64_t)(en - b) != nel * esz) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: tensor '%s' has an invalid shape or data "
                             "range (outside the file or not matching its shape)", name, safe_key(e->string, &nb));
            break;
        }
        t.data = data + (uint64_t)b;
        t.nbytes = nel * esz;
        t.name = strdup(e->string);
        if (!t.name || (rc = add_tensor(st, &cap, &t, name, err))) {
            free(t.name);
            if (!rc) rc = pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", name);
            break;
        }
    }
    cJSON_Delete(root);
    /* keep the invariant "capacity == count" that the next parse relies on */
    if (st->n_tensors && cap != st->n_tensors) {
        pgd_st_tensor *nt = realloc(st->tensors, st->n_tensors * sizeof *nt);
        if (nt) st->tensors = nt;
    }
    return rc;
}

static int open_file(pgd_safetensors *st, const char *path, pgd_err *err) {
    pgd_st_file *nf = realloc(st->files, (st->n_files + 1) * sizeof *nf);
    if (!nf) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
    st->files = nf;
    pgd_st_file *f = &st->files[st->n_files];
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return pgd_err_set(err, PGD_ENOMEM, "%s: out of memory", path);
    int rc = pgd_mapfile_open(&f->map, path, err);
    if (rc) {
        free(f->path);
        return rc;
    }
    st->n_files++;
    return pgd_st_parse(st, f->map.data, f->map.size, f->path, err);
}

int pgd_st_open_file(pgd_safetensors *st, const char *path, pgd_err *err) {
    memset(st, 0, sizeof *st);
    int rc = open_file(st, path, err);
    if (rc) pgd_st_close(st);
    return rc;
}

int pgd_st_open_dir(pgd_safetensors *st, const char *dir, pgd_err *err) {
    memset(st, 0, sizeof *st);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    char *idx = NULL;
    int rc = pgd_read_file(path, &idx, NULL, NULL);
    if (rc == PGD_ENOENT) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        return pgd_st_open_file(st, path, err);
    }
    if (rc) return pgd_err_set(err, rc, "%s: cannot read", path);
    cJSON *root = cJSON_Parse(idx);
    free(idx);
    cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return pgd_err_set(err, PGD_EFORMAT, "%s: no \"weight_map\" object", path);
    }
    /* Open each distinct shard once, in order of first appearance. */
    cJSON *e;
    pgd_name_buf nb;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !strcmp(e->valuestring, "..")) {
            rc = pgd_err_set(err, PGD_EFORMAT, "%s: invalid shard name for '%s'", path,
                             safe_key(e->string, &nb));
            break;
        }
        char shard[PATH_MAX];
        snprintf(shard, sizeof shard, "%s/%s", dir, e->valuestring);
        bool seen = false;
        for (size_t i = 0; i < st->n_files && !seen; i++) seen = !strcmp(st->files[i].path, shard);
        if (!seen && (rc = open_file(st, shard, err))) break;
    }
    cJSON_Delete(root);
    if (rc) pgd_st_close(st);
    return rc;
}

void pgd_st_close(pgd_safetensors *st) {
    for (size_t i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (size_t i = 0; i < st->n_files; i++) {
        pgd_mapfile_close(&st->files[i].map);
        free(st->files[i].path);
    }
    free(st->files);
    memset(st, 0, sizeof *st);
}

const pgd_st_tensor *pgd_st_find(const pgd_safetensors *st, const char *name) {
    for (size_t i = 0; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}

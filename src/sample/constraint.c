/* The output constraints of constraint.h: the mask memo, and the four kinds behind the ops
 * table -- JSON (json_grammar.h), choices, a regex (regex.h), a grammar (grammar.h). */
#include "sample/constraint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/status.h"

/* ---- the mask memo ---- */

int pgd_mask_memo_init(pgd_mask_memo *m, int32_t n_vocab, int32_t key_max) {
    memset(m, 0, sizeof *m);
    m->n_vocab = n_vocab;
    m->key_max = key_max;
    if (!(m->key = calloc((size_t)PGD_MASK_MEMO * (size_t)(1 + key_max), sizeof *m->key)))
        return PGD_ENOMEM;
    for (int i = 0; i < PGD_MASK_MEMO; i++)
        if (!(m->mask[i] = malloc((size_t)n_vocab))) return PGD_ENOMEM;
    return PGD_OK;
}

void pgd_mask_memo_free(pgd_mask_memo *m) {
    for (int i = 0; i < PGD_MASK_MEMO; i++) free(m->mask[i]);
    free(m->key);
    memset(m, 0, sizeof *m);
}

/* Slot i's key: its length, then its words. */
static int32_t *memo_key(const pgd_mask_memo *m, int i) {
    return m->key + (size_t)i * (size_t)(1 + m->key_max);
}

bool pgd_mask_memo_get(const pgd_mask_memo *m, const int32_t *key, int32_t n, uint8_t *allow) {
    if (n <= 0) return false;
    for (int i = 0; i < PGD_MASK_MEMO; i++) {
        const int32_t *k = memo_key(m, i);
        if (k[0] == n && !memcmp(k + 1, key, (size_t)n * sizeof *key)) {
            memcpy(allow, m->mask[i], (size_t)m->n_vocab);
            return true;
        }
    }
    return false;
}

void pgd_mask_memo_put(pgd_mask_memo *m, const int32_t *key, int32_t n, const uint8_t *allow) {
    if (n <= 0 || n > m->key_max) return;
    int i = m->next;
    m->next = (i + 1) % PGD_MASK_MEMO;
    memcpy(m->mask[i], allow, (size_t)m->n_vocab);
    int32_t *k = memo_key(m, i);
    k[0] = n;
    memcpy(k + 1, key, (size_t)n * sizeof *key);
}

/* ---- shared by the kinds ---- */

/* allow[] of every end-of-generation token = 1 (where the output may end). */
static void allow_eog(const pgd_constraint_env *env, uint8_t *allow) {
    for (int32_t k = 0; k < env->n_eog; k++) allow[env->eog[k]] = 1;
}

/* The end of a constructor: PGD_OK with *out = c, or (rc < 0) c freed (NULL: none was made),
 * rc returned and the error line `what` then msg in why. */
static int made(pgd_constraint *c, int rc, const char *what, const char *msg,
                pgd_constraint **out, char *why, size_t whylen) {
    if (!rc) {
        *out = c;
        return PGD_OK;
    }
    snprintf(why, whylen, "%s%s", what, msg);
    if (c) c->ops->free(c);
    return rc;
}

/* The drop-space mask by the definition: each text token, less its leading space, offered to
 * takes (which must not move c); end-of-generation tokens and tokens left empty refused. Cheap
 * for a DFA, the JSON machine and choices. */
static void mask_by_takes(pgd_constraint *c, const pgd_constraint_env *env, uint8_t *allow,
                          bool (*takes)(pgd_constraint *c, const char *t, size_t n)) {
    const pgd_json_vocab *v = env->vocab;
    memset(allow, 0, (size_t)env->n_vocab);
    for (int32_t id = 0; id < v->n; id++) {
        const char *t = v->text[id];
        size_t n = v->len[id];
        if (n > 0 && t[0] == ' ') t++, n--;
        if (v->eog[id] || n == 0) continue;
        allow[id] = takes(c, t, n);
    }
}

/* ---- JSON: an object, or a document of a schema ---- */

typedef struct {
    pgd_constraint base;
    pgd_json_state st;
    pgd_json_schema schema; /* the schema st reads, when there is one */
} json_c;

static int json_mask(pgd_constraint *c, const pgd_constraint_env *env, uint8_t *allow) {
    pgd_json_allowed(&((json_c *)c)->st, env->vocab, allow);
    return 0;
}

static bool json_takes(pgd_constraint *c, const char *t, size_t n) {
    pgd_json_state copy = ((json_c *)c)->st;
    return pgd_json_feed(&copy, t, n);
}

static int json_mask_drop_space(pgd_constraint *c, const pgd_constraint_env *env,
                                uint8_t *allow) {
    mask_by_takes(c, env, allow, json_takes);
    return 0;
}

/* DONE once the document is closed. */
static pgd_constraint_step json_accept(pgd_constraint *c, const pgd_constraint_env *env,
                                       int32_t id, const char *t, size_t n) {
    json_c *j = (json_c *)c;
    if (env->vocab->eog[id] || !n || !pgd_json_feed(&j->st, t, n)) return PGD_CONSTRAINT_REFUSED;
    return pgd_json_complete(&j->st) ? PGD_CONSTRAINT_DONE : PGD_CONSTRAINT_MORE;
}

static void json_free(pgd_constraint *c) {
    json_c *j = (json_c *)c;
    pgd_json_schema_free(&j->schema);
    free(j);
}

static const pgd_constraint_ops json_ops = {
    .mask = json_mask,
    .mask_drop_space = json_mask_drop_space,
    .accept = json_accept,
    .free = json_free,
};

int pgd_constraint_json_new(const char *schema, const pgd_json_schema *compiled,
                            const char *prefix, const char *suffix, pgd_constraint **out,
                            char *why, size_t whylen) {
    *out = NULL;
    char msg[200] = "out of memory";
    json_c *j = calloc(1, sizeof *j);
    if (!j) return made(NULL, PGD_ENOMEM, "", msg, out, why, whylen);
    j->base.ops = &json_ops;
    pgd_json_init(&j->st, true);
    int rc = PGD_OK;
    if (schema || compiled) {
        rc = compiled ? pgd_json_schema_copy(&j->schema, compiled)
                      : pgd_json_schema_compile(schema, strlen(schema), &j->schema, msg,
                                                sizeof msg);
        if (rc == PGD_ENOMEM) snprintf(msg, sizeof msg, "out of memory");
        if (!rc && ((prefix && !(j->schema.prefix = strdup(prefix))) ||
                    (suffix && !(j->schema.suffix = strdup(suffix))))) {
            rc = PGD_ENOMEM;
            snprintf(msg, sizeof msg, "out of memory");
        }
        if (!rc) pgd_json_init_schema(&j->st, &j->schema);
    }
    return made(&j->base, rc, "JSON schema: ", msg, out, why, whylen);
}

/* ---- choices ---- */

typedef struct {
    pgd_constraint base;
    char **choices;   /* (n) */
    size_t *len;      /* (n) their lengths */
    uint8_t *alive;   /* (n) the choices the output is still a prefix of */
    int32_t n;
    size_t pos;       /* bytes of output so far (each a prefix of the alive choices) */
} choice_c;

/* The tokens that keep the output a prefix of an alive choice, and the end-of-generation tokens
 * where it is one already. */
static int choice_mask(pgd_constraint *c, const pgd_constraint_env *env, uint8_t *allow) {
    const choice_c *ch = (const choice_c *)c;
    memset(allow, 0, (size_t)env->n_vocab);
    for (int32_t i = 0; i < ch->n; i++) {
        if (!ch->alive[i]) continue;
        size_t l = ch->len[i];
        if (l > ch->pos)
            pgd_json_vocab_allow_prefixes(env->vocab, ch->choices[i] + ch->pos, l - ch->pos,
                                          allow);
        else
            allow_eog(env, allow);
    }
    return 0;
}

/* Some alive choice goes on with t[0..n) after the output so far. */
static bool choice_takes(pgd_constraint *c, const char *t, size_t n) {
    const choice_c *ch = (const choice_c *)c;
    for (int32_t i = 0; i < ch->n; i++)
        if (ch->alive[i] && ch->len[i] >= ch->pos + n && !memcmp(ch->choices[i] + ch->pos, t, n))
            return true;
    return false;
}

static int choice_mask_drop_space(pgd_constraint *c, const pgd_constraint_env *env,
                                  uint8_t *allow) {
    mask_by_takes(c, env, allow, choice_takes);
    return 0;
}

/* DONE at an end-of-generation token (the mask allowed it: the output is a choice) or once the
 * output is a choice that no alive one continues. */
static pgd_constraint_step choice_accept(pgd_constraint *c, const pgd_constraint_env *env,
                                         int32_t id, const char *t, size_t n) {
    choice_c *ch = (choice_c *)c;
    if (env->vocab->eog[id]) return PGD_CONSTRAINT_DONE;
    size_t at = ch->pos;
    bool any = false, longer = false;
    for (int32_t i = 0; i < ch->n; i++) {
        size_t l = ch->len[i];
        if (!ch->alive[i] || l < at + n || memcmp(ch->choices[i] + at, t, n)) {
            ch->alive[i] = 0;
            continue;
        }
        any = true;
        longer |= l > at + n;
    }
    ch->pos += n;
    /* a refused token: only from logits with no finite value (the sampler's fallback) */
    if (!any || n == 0) return PGD_CONSTRAINT_REFUSED;
    return longer ? PGD_CONSTRAINT_MORE : PGD_CONSTRAINT_DONE;
}

static void choice_free(pgd_constraint *c) {
    choice_c *ch = (choice_c *)c;
    for (int32_t i = 0; i < ch->n; i++) free(ch->choices[i]);
    free(ch->choices);
    free(ch->len);
    free(ch->alive);
    free(ch);
}

static const pgd_constraint_ops choice_ops = {
    .mask = choice_mask,
    .mask_drop_space = choice_mask_drop_space,
    .accept = choice_accept,
    .free = choice_free,
};

int pgd_constraint_choice_new(const char *const *choices, int32_t n, pgd_constraint **out) {
    *out = NULL;
    choice_c *ch = calloc(1, sizeof *ch);
    if (!ch) return PGD_ENOMEM;
    ch->base.ops = &choice_ops;
    ch->choices = calloc((size_t)n, sizeof *ch->choices);
    ch->len = malloc((size_t)n * sizeof *ch->len);
    ch->alive = malloc((size_t)n);
    if (!ch->choices || !ch->len || !ch->alive) goto fail;
    memset(ch->alive, 1, (size_t)n);
    for (; ch->n < n; ch->n++) {
        if (!(ch->choices[ch->n] = strdup(choices[ch->n]))) goto fail;
        ch->len[ch->n] = strlen(choices[ch->n]);
    }
    *out = &ch->base;
    return PGD_OK;
fail:
    choice_free(&ch->base);
    return PGD_ENOMEM;
}

/* ---- a regular expression ---- */

typedef struct {
    pgd_constraint base;
    pgd_regex re;
    int32_t q;          /* the DFA's state */
    pgd_mask_memo memo; /* by state number */
} regex_c;

static int regex_mask(pgd_constraint *c, const pgd_constraint_env *env, uint8_t *allow) {
    regex_c *r = (regex_c *)c;
    int32_t key = r->q;
    if (pgd_mask_memo_get(&r->memo, &key, 1, allow)) return 0;
    pgd_json_vocab_walk_dfa(env->vocab, &r->re, r->q, allow);
    if (r->re.accept[r->q]) allow_eog(env, allow);
    pgd_mask_memo_put(&r->memo, &key, 1, allow);
    return 0;
}

static bool regex_takes(pgd_constraint *c, const char *t, size_t n) {
    const regex_c *r = (const regex_c *)c;
    return pgd_regex_feed(&r->re, r->q, t, n) >= 0;
}

static int regex_mask_drop_space(pgd_constraint *c, const pgd_constraint_env *env,
                                 uint8_t *allow) {
    regex_c *r = (regex_c *)c;
    mask_by_takes(c, env, allow, regex_takes);
    if (r->re.accept[r->q]) allow_eog(env, allow);
    return 0;
}

/* An end-of-generation token only where the mask let it (a match): DONE; DONE too at a match no
 * byte can extend. */
static pgd_constraint_step regex_accept(pgd_constraint *c, const pgd_constraint_env *env,
                                        int32_t id, const char *t, size_t n) {
    regex_c *r = (regex_c *)c;
    if (env->vocab->eog[id]) return PGD_CONSTRAINT_DONE;
    int32_t q = n ? pgd_regex_feed(&r->re, r->q, t, n) : -1;
    if (q < 0) return PGD_CONSTRAINT_REFUSED;
    r->q = q;
    return r->re.accept[q] && !r->re.extend[q] ? PGD_CONSTRAINT_DONE : PGD_CONSTRAINT_MORE;
}

static void regex_free(pgd_constraint *c) {
    regex_c *r = (regex_c *)c;
    pgd_regex_free(&r->re);
    pgd_mask_memo_free(&r->memo);
    free(r);
}

static const pgd_constraint_ops regex_ops = {
    .mask = regex_mask,
    .mask_drop_space = regex_mask_drop_space,
    .accept = regex_accept,
    .free = regex_free,
};

int pgd_constraint_regex_new(const char *pattern, const pgd_regex *compiled, int32_t n_vocab,
                             pgd_constraint **out, char *why, size_t whylen) {
    *out = NULL;
    char msg[200] = "out of memory";
    regex_c *r = calloc(1, sizeof *r);
    if (!r) return made(NULL, PGD_ENOMEM, "regular expression: ", msg, out, why, whylen);
    r->base.ops = &regex_ops;
    int rc = compiled ? pgd_regex_copy(&r->re, compiled)
                      : pgd_regex_compile(pattern, strlen(pattern), &r->re, msg, sizeof msg);
    if (rc) return made(&r->base, rc, "regular expression: ", msg, out, why, whylen);
    /* (the memo's failure is the request's plain "out of memory", as it always was) */
    rc = pgd_mask_memo_init(&r->memo, n_vocab, 1);
    return made(&r->base, rc, "", "out of memory", out, why, whylen);
}

/* ---- a grammar ---- */

typedef struct {
    pgd_constraint base;
    pgd_grammar g;
    pgd_grammar_state st; /* started at admission, on the engine thread (it needs the scratch) */
    pgd_mask_memo memo;   /* by pgd_grammar_key */
} grammar_c;

static int grammar_mask(pgd_constraint *c, const pgd_constraint_env *env, uint8_t *allow) {
    grammar_c *gc = (grammar_c *)c;
    pgd_grammar_key *key = env->gr_key;
    pgd_grammar_state_key(&gc->st, key);
    if (pgd_mask_memo_get(&gc->memo, key->w, key->n, allow)) return 0;
    if (pgd_grammar_allowed(&gc->st, &gc->g, env->gr_scratch, env->vocab, allow) < 0) return -1;
    if (pgd_grammar_complete(&gc->st)) allow_eog(env, allow);
    pgd_mask_memo_put(&gc->memo, key->w, key->n, allow);
    return 0;
}

/* Walks the trie with the space skipped (within the work limit: -1 past it). */
static int grammar_mask_drop_space(pgd_constraint *c, const pgd_constraint_env *env,
                                   uint8_t *allow) {
    grammar_c *gc = (grammar_c *)c;
    if (pgd_grammar_allowed_drop_space(&gc->st, &gc->g, env->gr_scratch, env->vocab, allow) < 0)
        return -1;
    if (pgd_grammar_complete(&gc->st)) allow_eog(env, allow);
    return 0;
}

/* As the regex: DONE at a sentence no byte can extend. */
static pgd_constraint_step grammar_accept(pgd_constraint *c, const pgd_constraint_env *env,
                                          int32_t id, const char *t, size_t n) {
    grammar_c *gc = (grammar_c *)c;
    if (env->vocab->eog[id]) return PGD_CONSTRAINT_DONE;
    if (!n || !pgd_grammar_feed(&gc->st, &gc->g, env->gr_scratch, t, n))
        return PGD_CONSTRAINT_REFUSED;
    return pgd_grammar_complete(&gc->st) && !pgd_grammar_extends(&gc->st) ? PGD_CONSTRAINT_DONE
                                                                           : PGD_CONSTRAINT_MORE;
}

static void grammar_start(pgd_constraint *c, pgd_grammar_scratch *sc) {
    grammar_c *gc = (grammar_c *)c;
    pgd_grammar_state_start(&gc->st, &gc->g, sc);
}

static void grammar_free(pgd_constraint *c) {
    grammar_c *gc = (grammar_c *)c;
    pgd_grammar_free(&gc->g);
    pgd_grammar_state_free(&gc->st);
    pgd_mask_memo_free(&gc->memo);
    free(gc);
}

static const pgd_constraint_ops grammar_ops = {
    .mask = grammar_mask,
    .mask_drop_space = grammar_mask_drop_space,
    .accept = grammar_accept,
    .start = grammar_start,
    .free = grammar_free,
};

int pgd_constraint_grammar_new(const char *text, const pgd_grammar *compiled, int32_t n_vocab,
                               pgd_constraint **out, char *why, size_t whylen) {
    *out = NULL;
    char msg[200] = "out of memory";
    grammar_c *gc = calloc(1, sizeof *gc);
    if (!gc) return made(NULL, PGD_ENOMEM, "grammar: ", msg, out, why, whylen);
    gc->base.ops = &grammar_ops;
    int rc = compiled ? pgd_grammar_copy(&gc->g, compiled)
                      : pgd_grammar_compile(text, strlen(text), &gc->g, msg, sizeof msg);
    if (!rc) rc = pgd_grammar_state_init(&gc->st);
    if (!rc) rc = pgd_mask_memo_init(&gc->memo, n_vocab, PGD_GRAMMAR_KEY_MAX);
    return made(&gc->base, rc, "grammar: ", msg, out, why, whylen);
}

/* ---- think first, then constrain ---- */

#define THINK_AFTER_MAX 32

typedef struct think_c {
    pgd_constraint base;
    pgd_constraint *inner;
    enum { TF_FIRST, TF_THINKING, TF_ON } state;
    int32_t think_tok;
    char after[THINK_AFTER_MAX];
    size_t after_len;
    char tail[2 * THINK_AFTER_MAX]; /* the thinking's last bytes: a match may straddle tokens */
    size_t tail_len;
} think_c;

static int think_masked(pgd_constraint *c, int rc, uint8_t *allow) {
    think_c *tc = (think_c *)c;
    if (rc == 0 && tc->state == TF_FIRST && tc->think_tok >= 0) allow[tc->think_tok] = 1;
    return rc;
}

static int think_mask(pgd_constraint *c, const pgd_constraint_env *env, uint8_t *allow) {
    think_c *tc = (think_c *)c;
    if (tc->state == TF_THINKING) return PGD_CONSTRAINT_FREE;
    return think_masked(c, pgd_constraint_mask(tc->inner, env, allow), allow);
}

static int think_mask_drop_space(pgd_constraint *c, const pgd_constraint_env *env,
                                 uint8_t *allow) {
    think_c *tc = (think_c *)c;
    if (tc->state == TF_THINKING) return PGD_CONSTRAINT_FREE;
    return think_masked(c, pgd_constraint_mask_drop_space(tc->inner, env, allow), allow);
}

/* While thinking: whether t[0..n) completes `after`, searched over the bytes kept from before
 * and these; keeps the last after_len - 1 for the next token. */
static bool think_ends(think_c *tc, const char *t, size_t n) {
    size_t keep = tc->after_len - 1;
    while (n) {
        size_t take = n < sizeof tc->tail - tc->tail_len ? n : sizeof tc->tail - tc->tail_len;
        memcpy(tc->tail + tc->tail_len, t, take);
        tc->tail_len += take;
        t += take;
        n -= take;
        if (memmem(tc->tail, tc->tail_len, tc->after, tc->after_len)) return true;
        if (tc->tail_len > keep) {
            memmove(tc->tail, tc->tail + tc->tail_len - keep, keep);
            tc->tail_len = keep;
        }
    }
    return false;
}

static pgd_constraint_step think_accept(pgd_constraint *c, const pgd_constraint_env *env,
                                        int32_t id, const char *t, size_t n) {
    think_c *tc = (think_c *)c;
    if (tc->state == TF_FIRST) {
        tc->state = id == tc->think_tok ? TF_THINKING : TF_ON;
        if (tc->state == TF_THINKING) return PGD_CONSTRAINT_MORE;
    }
    if (tc->state == TF_THINKING) { /* the constraint starts with the next token */
        if (think_ends(tc, t, n)) tc->state = TF_ON;
        return PGD_CONSTRAINT_MORE;
    }
    return pgd_constraint_accept(tc->inner, env, id, t, n);
}

static void think_start(pgd_constraint *c, pgd_grammar_scratch *sc) {
    pgd_constraint_start(((think_c *)c)->inner, sc);
}

static void think_free(pgd_constraint *c) {
    pgd_constraint_free(((think_c *)c)->inner);
    free(c);
}

static const pgd_constraint_ops think_ops = {
    .mask = think_mask,
    .mask_drop_space = think_mask_drop_space,
    .accept = think_accept,
    .start = think_start,
    .free = think_free,
};

int pgd_constraint_think_first_new(pgd_constraint *inner, const char *after, int32_t think_tok,
                                   pgd_constraint **out) {
    *out = NULL;
    size_t l = strlen(after);
    think_c *tc = l && l < THINK_AFTER_MAX ? calloc(1, sizeof *tc) : NULL;
    if (!tc) {
        pgd_constraint_free(inner);
        return l && l < THINK_AFTER_MAX ? PGD_ENOMEM : PGD_EINVAL;
    }
    tc->base.ops = &think_ops;
    tc->inner = inner;
    tc->think_tok = think_tok;
    tc->state = think_tok >= 0 ? TF_FIRST : TF_THINKING;
    memcpy(tc->after, after, l);
    tc->after_len = l;
    *out = &tc->base;
    return PGD_OK;
}

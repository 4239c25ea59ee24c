/* Tokenizers: byte-level BPE (GPT-2/SmolLM2, Llama 3, Qwen2 pre-tokenizers) and SentencePiece
 * BPE with byte fallback (Llama 2, Mistral, TinyLlama); special and added tokens. Loaded from
 * GGUF metadata or a Hugging Face tokenizer.json (+ tokenizer_config.json).
 * A loaded tokenizer is immutable and safe to use from several threads at once. */
#ifndef PGD_TOKENIZER_H
#define PGD_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "util/status.h"

typedef struct pgd_tokenizer pgd_tokenizer;

/* Loads the tokenizer stored in GGUF metadata (tokenizer.ggml.*). g is borrowed during the call
 * only: everything needed is copied. Error messages name g->path. */
int pgd_tokenizer_load_gguf(const pgd_gguf *g, pgd_tokenizer **out, pgd_err *err);
/* Loads from a Hugging Face tokenizer.json; config_path (tokenizer_config.json) may be NULL.
 * Fills bos/eos/add_bos and the chat template from the config when present. */
int pgd_tokenizer_load_hf(const char *tokenizer_json_path, const char *config_path,
                          pgd_tokenizer **out, pgd_err *err);
/* Loads only the tokenizer of a model path: a GGUF file (its metadata; vocabulary-only files
 * work) or a Hugging Face directory (DIR/tokenizer.json + DIR/tokenizer_config.json). */
int pgd_tokenizer_load_path(const char *path, pgd_tokenizer **out, pgd_err *err);
void pgd_tokenizer_free(pgd_tokenizer *t);

int32_t pgd_tokenizer_n_vocab(const pgd_tokenizer *t);
int32_t pgd_tokenizer_bos(const pgd_tokenizer *t); /* -1 if none */
int32_t pgd_tokenizer_eos(const pgd_tokenizer *t); /* -1 if none */
bool pgd_tokenizer_add_bos(const pgd_tokenizer *t); /* metadata says to prepend BOS */
/* True if id is an end-of-generation token (eos, eot, <|im_end|>, <|eot_id|> ...). */
bool pgd_tokenizer_is_eog(const pgd_tokenizer *t, int32_t id);
/* Chat template string (NUL-terminated) or NULL. Borrowed from t. */
const char *pgd_tokenizer_chat_template(const pgd_tokenizer *t);

/* Encodes text[0..len) (any bytes; invalid UTF-8 is encoded, never rejected).
 * add_bos: prepend BOS (only if the vocabulary has one). parse_special: recognise special/added
 * token strings in the text (e.g. "<|im_start|>") as single tokens.
 * Writes at most cap ids to out and the total count needed to *n_out; returns PGD_ERANGE if
 * cap was too small (call again with a larger buffer). */
int pgd_tokenizer_encode(const pgd_tokenizer *t, const char *text, size_t len, bool add_bos,
                         bool parse_special, int32_t *out, size_t cap, size_t *n_out);
/* As pgd_tokenizer_encode with the model's special tokens when add_special (HF's
 * add_special_tokens): BOS when its metadata says so, and the token its post-processor appends
 * after the text, if any (Qwen3-Embedding's end of text; GGUF add_eos_token: EOS). */
int pgd_tokenizer_encode_special(const pgd_tokenizer *t, const char *text, size_t len,
                                 bool add_special, bool parse_special, int32_t *out, size_t cap,
                                 size_t *n_out);

/* The pre-tokenizer alone (its regex, as written in the vocabulary: no special-token parsing,
 * no normalization): calls fn with the bytes of each piece of text[0..len), in order (a piece is
 * a part of text, or one with the space ByteLevel(add_prefix_space) puts before it).
 * A SentencePiece vocabulary has none: one piece. Stops at fn's first non-zero return and
 * returns it; PGD_ENOMEM if scratch memory could not be had. For testing the matchers against
 * a regex engine (`pagoda tokenize --pieces`). */
int pgd_tokenizer_pieces(const pgd_tokenizer *t, const char *text, size_t len,
                         int (*fn)(void *ctx, const char *piece, size_t len), void *ctx);
/* Is the vocabulary byte-level (GPT-2's byte-to-unicode alphabet)? */
bool pgd_tokenizer_byte_level(const pgd_tokenizer *t);
/* Runs the tokenizer's hand-written pre-tokenizer (GPT-2, SmolLM, Llama 3, Qwen2, Tekken) through
 * the general regex engine instead, as the pipeline it stands for: the same pieces (the tests
 * prove it), slower; for those tests and the benchmark. Call right after loading, before any
 * other thread uses t. */
int pgd_tokenizer_use_general_pretok(pgd_tokenizer *t, pgd_err *err);

/* The general pre-tokenizer regex engine alone, as HF's Split(pattern, behavior, invert) (behavior:
 * "Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"): for tests and
 * tools that compare it with other engines. */
typedef struct pgd_split_regex pgd_split_regex;
int pgd_split_regex_new(const char *pattern, const char *behavior, bool invert,
                        pgd_split_regex **out, pgd_err *err);
/* Calls fn with each piece of text[0..len) in order; stops at fn's first non-zero return. */
int pgd_split_regex_run(const pgd_split_regex *r, const char *text, size_t len,
                        int (*fn)(void *ctx, const char *piece, size_t len), void *ctx);
void pgd_split_regex_free(pgd_split_regex *r);

/* The bytes a token stands for when decoded (byte-level mapping undone, "▁" turned into a
 * space, <0xAB> byte tokens turned into their byte). Special/control tokens give their text
 * when render_special, else nothing. Writes up to cap bytes, returns the byte length or a
 * negative status (PGD_EINVAL for an id out of range). */
int pgd_tokenizer_token_bytes(const pgd_tokenizer *t, int32_t id, bool render_special,
                              char *buf, size_t cap);
/* The same bytes, borrowed (valid while t lives), special tokens rendering as nothing; NULL
 * with *n = 0 for those and for ids out of range. */
const char *pgd_tokenizer_piece(const pgd_tokenizer *t, int32_t id, size_t *n);

/* Decodes a whole sequence into a malloc'd NUL-terminated string (caller frees). Applies the
 * SentencePiece rule of dropping the leading space of the first token when the vocabulary
 * adds a dummy prefix (as HF's decode does with skip_special_tokens). The text is well-formed
 * UTF-8: each maximal ill-formed subpart of the bytes becomes U+FFFD (HF's ByteLevel decoder
 * does the same; its SentencePiece ByteFallback replaces each byte of an ill-formed run of
 * byte tokens instead). */
int pgd_tokenizer_decode(const pgd_tokenizer *t, const int32_t *ids, size_t n,
                         bool render_special, char **out, size_t *out_len);

/* Incremental detokenizer for streaming: feed ids one at a time, get back only complete UTF-8
 * characters; bytes of an unfinished character are held until it completes (or flushed as one
 * U+FFFD at the end). */
typedef struct pgd_detok {
    const pgd_tokenizer *tok; /* borrowed */
    bool first;               /* no text emitted yet (for the SentencePiece leading space) */
    bool render_special;
    unsigned char pending[8]; /* bytes of an incomplete UTF-8 sequence */
    int n_pending;
} pgd_detok;

void pgd_detok_init(pgd_detok *d, const pgd_tokenizer *t, bool render_special);
/* Appends the text completed by token id to out (up to cap bytes); returns the number of bytes
 * written, or a negative status. The text is well-formed UTF-8: bytes that form no character
 * (a byte token out of place) come out as U+FFFD, one per maximal ill-formed subpart, as in
 * pgd_tokenizer_decode. cap >= pgd_detok_cap(t) is always enough for one token. */
int pgd_detok_push(pgd_detok *d, int32_t id, char *out, size_t cap);
/* The next piece that starts with a space (and is not special) loses that space: the
 * SentencePiece rule for the first piece, when d has emitted nothing yet. */
bool pgd_detok_drops_space(const pgd_detok *d);
size_t pgd_detok_cap(const pgd_tokenizer *t);
/* Ends the stream: an unfinished character still pending comes out as U+FFFD (3 bytes; cap >=
 * 3), as Hugging Face's decode reports it. Returns the bytes written (0 or 3). */
int pgd_detok_flush(pgd_detok *d, char *out, size_t cap);

#endif

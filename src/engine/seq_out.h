/* A sequence's output-side state, apart from the record the scheduler reads (request.h): its
 * sampler, detokenizer, adaptive speculation and draft-model KV. Allocated with the record
 * (pgd__request_new) and reached through seq.out. Internal to src/engine. */
#ifndef PGD_ENGINE_SEQ_OUT_H
#define PGD_ENGINE_SEQ_OUT_H

#include "engine/request.h"
#include "sample/constraint.h"
#include "sample/sampler.h"
#include "spec/spec.h"
#include "tokenizer/tokenizer.h"

struct seq_out {
    pgd_sampler sampler;
    pgd_detok detok;
    pgd_spec_adapt adapt;     /* the adaptive number of proposals */
    pgd_draft_seq dseq;       /* draft-model KV (DRAFT mode) */
};

#endif

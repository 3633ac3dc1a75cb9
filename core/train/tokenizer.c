/*
 * tokenizer.c: the run's tokenizer (train_int.h): the one given, checked against the model's
 * vocabulary, or the checkpoint's on a resume; and the samples' codec over it.
 */
#include "train_int.h"


/* The tokenizer: the one given fits the model's vocabulary; without one, a resume keeps the
 * checkpoint's tokenizer.json (read verified), recorded again in each new checkpoint. */
int zr_train__pick_tokenizer(run *r)
{
    const zr_train_opts *o = r->o;
    if (o->tokenizer_json) {
        if (o->tokenizer_vocab > r->cfg.vocab)
            return zr_err_set(ZR_EINVAL, "the tokenizer %s has a vocabulary of %u tokens, the "
                              "model only %u (--model ...,vocab=%u)",
                              o->tokenizer_path ? o->tokenizer_path : "", o->tokenizer_vocab,
                              r->cfg.vocab, o->tokenizer_vocab);
        return 0;
    }
    if (!r->from)
        return 0;
    int rc = zck_ckpt_file_read(&r->ck_tokenizer, &r->ck_tokenizer_bytes, r->from,
                                "tokenizer.json");
    return rc == ZR_ENOTFOUND ? 0 : rc;
}

/* The samples' codec: the caller's over the run's tokenizer (given, or the checkpoint's),
 * else bytes. */
int zr_train__open_codec(run *r)
{
    const zr_train_opts *o = r->o;
    const char *json = o->tokenizer_json ? o->tokenizer_json : r->ck_tokenizer;
    size_t n = o->tokenizer_json ? o->tokenizer_bytes : r->ck_tokenizer_bytes;
    if (!json || !o->text_codec)
        return 0;
    ZR_TRY(o->text_codec->open(&r->codec.ctx, json, n));
    r->codec.ops = o->text_codec;
    return 0;
}

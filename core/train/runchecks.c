/*
 * runchecks.c: checks of a run's options against what the run finds (train_int.h), kept out of
 * the loop: data read as bytes beside a BPE tokenizer; a JSON log inside the run directory;
 * the note of a resume that changes the learning-rate schedule; retention at start.
 */
#include "train_int.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A BPE tokenizer (given, or the checkpoint's on a resume) over data read as bytes: the model
 * would learn byte ids while every checkpoint names the tokenizer, with which zgen and the
 * samples would then encode prompts for it. Refused, naming ztok encode. */
int zr_train__check_bytes_data(const zr_train_opts *o, int data_is_bytes, const char *ck)
{
    if (!data_is_bytes || (!o->tokenizer_json && !ck))
        return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", ck ? ck : "");
    const char *tok = o->tokenizer_json ? (o->tokenizer_path ? o->tokenizer_path : "(given)")
                                        : path;
    const char *whose = o->tokenizer_json ? "--tokenizer " : "the checkpoint's ";
    if (!strcmp(o->data, "synthetic"))
        return zr_err_set(ZR_EINVAL, "--data synthetic is a corpus of byte tokens, but the run "
                          "has a BPE tokenizer (%s%s), which every checkpoint would record: "
                          "give --data a token file encoded with it (ztok encode --tokenizer "
                          "%s TEXT... -o tokens.bin)", whose, tok, tok);
    return zr_err_set(ZR_EINVAL, "--data %s is read as raw bytes (token ids 0-255), but the "
                      "run has a BPE tokenizer (%s%s), which every checkpoint would record and "
                      "zgen would encode prompts with: encode the text first (ztok encode "
                      "--tokenizer %s %s -o tokens.bin) and train on --data tokens.bin",
                      o->data, whose, tok, tok, o->data);
}

int zr_train__log_in_run(const char *path, const char *ckpt_dir)
{
    char *dir = strdup(path), *rund = realpath(ckpt_dir, NULL), *d = NULL;
    char *slash = dir ? strrchr(dir, '/') : NULL;
    if (dir && slash)
        slash == dir ? (void)(slash[1] = 0) : (void)(*slash = 0);
    if (dir)
        d = realpath(slash ? dir : ".", NULL);
    size_t n = rund ? strlen(rund) : 0;
    int in = d && rund && !strncmp(d, rund, n) && (d[n] == 0 || d[n] == '/' || n == 1);
    free(dir);
    free(rund);
    free(d);
    return in;
}

void zr_train__schedule_note(FILE *log, const zr_train__section *s, const zr_train_opts *o,
                             uint64_t step)
{
    if (!log || !s->sched_known)
        return;
    float old_lr = (float)s->lr, old_mr = (float)s->min_lr_ratio;
    if (s->steps == o->steps && s->warmup == o->warmup && old_lr == o->lr &&
        old_mr == o->min_lr_ratio)
        return;
    float was = zr_lr_at(step, s->warmup, s->steps, old_lr, old_mr);
    float now = zr_lr_at(step, o->warmup, o->steps, o->lr, o->min_lr_ratio);
    char warm[160] = "";
    if (step < o->warmup)
        snprintf(warm, sizeof warm, "; step %llu is inside the new warmup of %llu steps: the "
                 "learning rate ramps up again", (unsigned long long)step + 1,
                 (unsigned long long)o->warmup);
    fprintf(log, "note: the checkpoint was trained with --steps %llu --lr %g --warmup %llu "
                 "--min-lr-ratio %g; this run uses --steps %llu --lr %g --warmup %llu "
                 "--min-lr-ratio %g: the schedule is recomputed with the new values from step "
                 "%llu on, at lr %.3g where the old one gave %.3g%s\n",
            (unsigned long long)s->steps, (double)old_lr, (unsigned long long)s->warmup,
            (double)old_mr, (unsigned long long)o->steps, (double)o->lr,
            (unsigned long long)o->warmup, (double)o->min_lr_ratio,
            (unsigned long long)step + 1, (double)now, (double)was, warm);
}

void zr_train__retain_at_start(FILE *log, const zck_lock *lk, const zr_train_opts *o,
                               const char *from)
{
    if (!lk || !o->keep_last)
        return;
    zck_prune_opts po = ZCK_PRUNE_OPTS_INIT;
    po.keep_last = o->keep_last;
    zck_namelist rm = {0, NULL};
    if (zck_prune_held(&rm, lk, o->ckpt_dir, from, &po) < 0) {
        if (log)
            fprintf(log, "warning: retention (--keep-last %u) before the first save failed: "
                         "%s\n", o->keep_last, zr_err_msg());
        zr_err_clear();
    } else if (log && rm.n) {
        fprintf(log, "retention (--keep-last %u) before the first save removed", o->keep_last);
        for (size_t i = 0; i < rm.n; i++)
            fprintf(log, "%s %s", i ? "," : "", rm.name[i]);
        fputc('\n', log);
    }
    zck_namelist_free(&rm);
}

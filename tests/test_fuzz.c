/*
 * test_fuzz.c: every fuzz corpus (tests/fuzz/corpus/<target>/) replayed through its target's
 * entry point (tests/fuzz/fuzz.h), as a plain regression test that needs no libFuzzer: no input
 * may crash or abort (a rejection without a message aborts), and each corpus must hold inputs
 * the parser accepts and inputs it refuses. Also: the manifest target's round-trip check fails
 * when a dump does not parse back. tests/fuzz/mkcorpus.py regenerates every corpus but the
 * manifest's (test_manifest.c writes that one with ZT_WRITE_CORPUS).
 */
#include "ckutil.h"
#include "fuzz/fuzz.h"
#include "zck_int.h"

#include <dirent.h>

static void replay(const char *target, int (*fn)(const uint8_t *, size_t), int min_files)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/%s", zt_root(), target);
    DIR *d = opendir(dir);
    if (!d)
        ZT_FAIL("%s: cannot open the fuzz corpus", dir);
    struct dirent *de;
    int n = 0, accepted = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char p[8192], *data;
        size_t len;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        ZT_OK(zck__read_small(&data, &len, p, 1 << 24));
        int ok = fn((const uint8_t *)data, len);
        ZT_CHECK(ok == 0 || ok == 1);
        accepted += ok;
        free(data);
        n++;
    }
    closedir(d);
    zfuzz_cleanup();
    fprintf(stderr, "  %s: replayed %d corpus files, %d accepted\n", target, n, accepted);
    if (n < min_files)
        ZT_FAIL("%s: %d corpus files, expected at least %d", target, n, min_files);
    if (accepted == 0 || accepted == n)
        ZT_FAIL("%s: %d of %d corpus files accepted: the corpus needs valid and invalid "
                "inputs", target, accepted, n);
}

ZT_TEST(fuzz_replay_manifest) { replay("manifest", zfuzz_manifest, 10); }
ZT_TEST(fuzz_replay_shard) { replay("shard", zfuzz_shard, 8); }
ZT_TEST(fuzz_replay_safetensors) { replay("safetensors", zfuzz_safetensors, 8); }
ZT_TEST(fuzz_replay_llmc_model) { replay("llmc_model", zfuzz_llmc_model, 8); }
ZT_TEST(fuzz_replay_llmc_tokens) { replay("llmc_tokens", zfuzz_llmc_tokens, 8); }
ZT_TEST(fuzz_replay_archive) { replay("archive", zfuzz_archive, 6); }
ZT_TEST(fuzz_replay_model) { replay("model", zfuzz_model, 8); }
ZT_TEST(fuzz_replay_training) { replay("training", zfuzz_training, 8); }
ZT_TEST(fuzz_replay_hf_config) { replay("hf_config", zfuzz_hf_config, 8); }
ZT_TEST(fuzz_replay_tokenizer) { replay("tokenizer", zfuzz_tokenizer, 8); }
ZT_TEST(fuzz_replay_torchzip) { replay("torchzip", zfuzz_torchzip, 6); }
ZT_TEST(fuzz_replay_pickle) { replay("pickle", zfuzz_pickle, 8); }

/* The round-trip check must fail, not pass silently, when the dump of an accepted manifest
 * does not parse back: a manifest parsed from a real checkpoint, then given a ZeRO stage the
 * parser refuses, dumps to text that does not parse. */
ZT_TEST(fuzz_manifest_roundtrip_catches_a_dump_that_does_not_parse)
{
    const uint64_t sizes[] = {100, 7};
    zck_layout *L = zt_layout(2, sizes);
    char *ckpt = zt_save("run", L, 2, 5, 1, 0);
    zck_layout_free(L);
    char path[512], *txt;
    size_t len;
    snprintf(path, sizeof path, "%s/manifest.json", ckpt);
    ZT_OK(zck__read_small(&txt, &len, path, 1 << 24));
    zck_manifest *m = NULL;
    ZT_OK(zck__manifest_parse(&m, txt, len, "manifest.json"));
    ZT_CHECK_EQ(zfuzz_manifest_roundtrip(m), 0);
    ZT_CHECK_EQ(zfuzz_manifest((const uint8_t *)txt, len), 1);
    m->stage = 7; /* dumps as "zero_stage": 7, which the parser refuses */
    char *dump = NULL;
    ZT_OK(zck__manifest_dump(&dump, m));
    ZT_CHECK(strstr(dump, "\"zero_stage\": 7"));
    zck_manifest *m2 = NULL;
    ZT_CHECK(zck__manifest_parse(&m2, dump, strlen(dump), "dump") == ZR_ECORRUPT);
    ZT_CHECK_EQ(zfuzz_manifest_roundtrip(m), -1);
    zck__manifest_free(m);
    free(dump);
    free(txt);
    free(ckpt);
}

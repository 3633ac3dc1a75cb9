/*
 * fuzz.h: the fuzz targets of tests/fuzz/ and what they share. Each fuzz_<target>.c defines
 * zfuzz_<target>(data, size), the one entry point that both libFuzzer (make fuzz, through
 * ZFUZZ_ENTRY when built with -DZFUZZ_LIBFUZZER) and the replay of tests/fuzz/corpus/<target>/
 * in make test (tests/test_fuzz.c) call. An entry point returns 1 when the parser accepted the
 * input and 0 when it rejected it with a message; it abort()s on anything else (a rejection
 * with no message, an accepted input that does not round-trip), so libFuzzer reports it.
 */
#ifndef ZT_FUZZ_H
#define ZT_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int zfuzz_manifest(const uint8_t *data, size_t size);
int zfuzz_shard(const uint8_t *data, size_t size);
int zfuzz_safetensors(const uint8_t *data, size_t size);
int zfuzz_llmc_model(const uint8_t *data, size_t size);
int zfuzz_llmc_tokens(const uint8_t *data, size_t size);
int zfuzz_archive(const uint8_t *data, size_t size);
int zfuzz_model(const uint8_t *data, size_t size);
int zfuzz_training(const uint8_t *data, size_t size);
int zfuzz_hf_config(const uint8_t *data, size_t size);
int zfuzz_tokenizer(const uint8_t *data, size_t size);
int zfuzz_torchzip(const uint8_t *data, size_t size);
int zfuzz_pickle(const uint8_t *data, size_t size);

/* The manifest target's round-trip check, for its regression test: 0 when the dump of m parses
 * back and dumps to the same text; -1 (and a line on stderr) when it does not. */
int zfuzz_manifest_roundtrip(const void *m /* const zck_manifest * */);

#ifdef ZFUZZ_LIBFUZZER
#define ZFUZZ_ENTRY(fn)                                                                        \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);                              \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)                               \
    {                                                                                          \
        (void)fn(data, size);                                                                  \
        return 0;                                                                              \
    }
#else
#define ZFUZZ_ENTRY(fn)
#endif

/* ---------------------------------------------------------------- helpers (fuzzutil.c) */

/* The verdict on a parser's result: 1 for 0; 0 for a negative code with a message; abort()
 * for a negative code with no message (every rejection must say why) or a positive one. what
 * names the parser on stderr. */
int zfuzz_verdict(int rc, const char *what);
/* A NUL-terminated malloc'ed copy of the input (abort() when out of memory). */
char *zfuzz_cstr(const uint8_t *data, size_t size);
/* A path naming a file that holds exactly these bytes (a memfd, "/proc/self/fd/N", reused by
 * the next call). */
const char *zfuzz_file(const uint8_t *data, size_t size);
/* A directory of this process's own (created once under $TMPDIR or /tmp), and a path inside it
 * (a static buffer); zfuzz_cleanup removes it (also run at exit). */
const char *zfuzz_dir(void);
const char *zfuzz_path(const char *name);
void zfuzz_rmtree(const char *path);
void zfuzz_cleanup(void);

#endif

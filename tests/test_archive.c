/*
 * test_archive.c: checkpoints as tar archives (formats/archive.c). Pack -> unpack round trips
 * for .tar, .tar.gz and .tar.zst; the streaming verifier finds damaged, missing and extra
 * members; unpack refuses hostile archives (written here with libarchive's writer) before
 * anything reaches the disk outside the run directory, and leaves no partial checkpoint.
 */
#include "ckutil.h"
#include "zfmt.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

static const uint64_t sizes[] = {20000, 65, 3};

static char *fresh(const char *run, uint64_t step, uint64_t seed)
{
    zck_layout *L = zt_layout(3, sizes);
    char *p = zt_save(run, L, 3, step, seed, 0);
    zck_layout_free(L);
    return p;
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* entries of dir other than . and .. (0 when it does not exist); listed when not expected */
static size_t n_entries_(const char *dir, int show)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            if (show)
                fprintf(stderr, "  %s holds %s\n", dir, de->d_name);
            n++;
        }
    closedir(d);
    return n;
}

#define EXPECT_ENTRIES(dir, n)                                                                 \
    do {                                                                                       \
        if (n_entries_((dir), 0) != (size_t)(n)) {                                             \
            n_entries_((dir), 1);                                                              \
            ZT_FAIL("%s holds %zu entries, expected %d", (dir), n_entries_((dir), 0), (n));   \
        }                                                                                      \
    } while (0)

/* number of problems zfmt_archive_verify finds (printing them) */
static size_t verify_count(const char *arc, uint64_t *hashed)
{
    zck_report *rep;
    ZT_OK(zfmt_archive_verify(&rep, arc, NULL));
    size_t n = zt_report_print(rep, arc);
    if (hashed)
        *hashed = zck_report_bytes_hashed(rep);
    zck_report_free(rep);
    return n;
}

/* the archive verifier must find exactly one problem, of this kind, in this file */
static void expect_one(const char *arc, zck_problem_kind kind, const char *file,
                       const char *detail)
{
    zck_report *rep;
    ZT_OK(zfmt_archive_verify(&rep, arc, NULL));
    zt_expect_one_problem(rep, arc, kind, file, detail);
}

static uint64_t shard_bytes(const char *ckpt)
{
    zck_reader *r;
    ZT_OK(zck_reader_open(&r, ckpt));
    uint64_t n = 0;
    for (size_t i = 0; i < zck_reader_n_shards(r); i++)
        n += zck_shard_bytes(zck_reader_shard(r, i));
    zck_reader_free(r);
    return n;
}

typedef struct {
    int calls;
    uint64_t done, total;
    char what[32];
} prog_seen;

static void on_progress(void *ctx, const char *what, uint64_t done, uint64_t total)
{
    prog_seen *s = ctx;
    s->calls++;
    s->done = done;
    s->total = total;
    snprintf(s->what, sizeof s->what, "%s", what);
}

/* ---------------------------------------------------------------- archives written here */

static struct archive *tar_open(const char *path, int ustar)
{
    struct archive *a = archive_write_new();
    ZT_CHECK(a);
    ZT_CHECK_EQ(ustar ? archive_write_set_format_ustar(a)
                      : archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
    ZT_CHECK_EQ(archive_write_open_filename(a, path), ARCHIVE_OK);
    return a;
}

static void tar_close(struct archive *a)
{
    ZT_CHECK_EQ(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
}

/* a member of any type; data (n bytes) for regular files, link for links */
static void tar_add(struct archive *a, const char *name, unsigned type, const char *link,
                    int hard, const void *data, size_t n)
{
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_pathname(e, name);
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, type == AE_IFDIR ? 0755 : 0644);
    if (type == AE_IFCHR) {
        archive_entry_set_rdevmajor(e, 1);
        archive_entry_set_rdevminor(e, 3);
    }
    if (link && hard)
        archive_entry_set_hardlink(e, link);
    else if (link)
        archive_entry_set_symlink(e, link);
    archive_entry_set_size(e, type == AE_IFREG ? (la_int64_t)n : 0);
    if (archive_write_header(a, e) != ARCHIVE_OK)
        ZT_FAIL("%s: %s", name, archive_error_string(a));
    if (type == AE_IFREG && n && !(link && hard))
        ZT_CHECK_EQ(archive_write_data(a, data, n), (la_ssize_t)n);
    archive_entry_free(e);
}

static void tar_add_text(struct archive *a, const char *name, const char *text)
{
    tar_add(a, name, AE_IFREG, NULL, 0, text, strlen(text));
}

/* dir/file as member top/file */
static void tar_add_file(struct archive *a, const char *dir, const char *top, const char *file)
{
    char path[512], name[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    snprintf(name, sizeof name, "%s/%s", top, file);
    FILE *f = fopen(path, "rb");
    ZT_CHECK(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    ZT_CHECK(buf && fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    tar_add(a, name, AE_IFREG, NULL, 0, buf, (size_t)n);
    free(buf);
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    ZT_CHECK(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*n + 1);
    ZT_CHECK(buf && fread(buf, 1, *n, f) == *n);
    fclose(f);
    return buf;
}

/* offset of the 512-byte tar header block of member name */
static size_t header_offset(const char *arc, const char *name)
{
    size_t n;
    char *buf = slurp(arc, &n);
    for (size_t off = 0; off + 512 <= n; off += 512)
        if (!memcmp(buf + off, name, strlen(name) + 1)) {
            free(buf);
            return off;
        }
    ZT_FAIL("%s: no header for %s", arc, name);
}

/* Make the size field of member name's ustar header say size (base-256), fixing the checksum. */
static void patch_size(const char *arc, const char *name, uint64_t size)
{
    size_t off = header_offset(arc, name), n;
    char *buf = slurp(arc, &n);
    unsigned char *h = (unsigned char *)buf + off;
    memset(h + 124, 0, 12);
    h[124] = 0x80;
    for (int i = 0; i < 8; i++)
        h[128 + i] = (unsigned char)(size >> (8 * (7 - i)));
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    h[155] = ' ';
    FILE *f = fopen(arc, "wb");
    ZT_CHECK(f && fwrite(buf, 1, n, f) == n);
    fclose(f);
    free(buf);
}

/* Unpack must fail naming member (and giving reason), and leave out/ without a step directory
 * or a temporary directory; the verifier must read the archive and report a problem. */
static void expect_refused(const char *arc, const char *member, const char *reason)
{
    char quoted[600];
    snprintf(quoted, sizeof quoted, "'%s'", member);
    ZT_ERR(zfmt_unpack(arc, "out", NULL), ZR_ECORRUPT, quoted);
    if (!strstr(zr_err_msg(), reason))
        ZT_FAIL("message '%s' lacks '%s'", zr_err_msg(), reason);
    ZT_CHECK(!exists("out")); /* created by the unpack, and removed with everything in it */
    zck_report *rep;
    ZT_OK(zfmt_archive_verify(&rep, arc, NULL));
    ZT_CHECK(zck_report_count(rep) > 0);
    zck_report_free(rep);
}

/* ---------------------------------------------------------------- round trips */

static void roundtrip(const char *suffix, int via_run_dir)
{
    char *p = fresh("run", 7, 42);
    char arc[64];
    snprintf(arc, sizeof arc, "ck%s", suffix);
    prog_seen ps = {0};
    zck_progress prog = {on_progress, &ps};
    zr_err_clear();
    int rc = zfmt_pack(via_run_dir ? "run" : p, arc, &prog);
    if (rc == ZR_EUNSUPPORTED)
        ZT_SKIP("%s", zr_err_msg());
    ZT_OK(rc);
    EXPECT_ENTRIES(".", 2); /* run and the archive: no temporary file left */
    uint64_t total = shard_bytes(p);
    ZT_CHECK(ps.calls > 0 && !strcmp(ps.what, "pack"));
    ZT_CHECK_EQ(ps.done, total);
    ZT_CHECK_EQ(ps.total, total);

    uint64_t hashed;
    ZT_CHECK_EQ(verify_count(arc, &hashed), 0);
    ZT_CHECK_EQ(hashed, total);

    ps = (prog_seen){0};
    ZT_OK(zfmt_unpack(arc, "out", &prog));
    ZT_CHECK(ps.calls > 0 && !strcmp(ps.what, "unpack") && ps.done == ps.total);
    ZT_CHECK_EQ(zt_verify_count("out/step-00000007", 0), 0);
    zt_check_content("out", 42); /* through latest */
    char *lp;
    ZT_OK(zck_latest(&lp, "out"));
    ZT_CHECK(!strcmp(lp, "out/step-00000007"));
    EXPECT_ENTRIES("out", 2); /* latest and the step: no temporary directory */
    free(lp);
    free(p);
}

ZT_TEST(archive_roundtrip_tar) { roundtrip(".tar", 0); }
ZT_TEST(archive_roundtrip_tar_gz) { roundtrip(".tar.gz", 1); }
ZT_TEST(archive_roundtrip_tar_zst) { roundtrip(".tar.zst", 0); }

/* members of several MiB: data crosses many chunks, progress is throttled */
ZT_TEST(archive_roundtrip_large_members)
{
    static const uint64_t big[] = {1500000, 100};
    zck_layout *L = zt_layout(2, big);
    char *p = zt_save("run", L, 2, 3, 5, 0);
    zck_layout_free(L);
    prog_seen ps = {0};
    zck_progress prog = {on_progress, &ps};
    ZT_OK(zfmt_pack(p, "big.tar.gz", &prog));
    ZT_CHECK(ps.calls >= 2 && ps.calls < 100);
    ZT_CHECK_EQ(ps.done, shard_bytes(p));
    ps = (prog_seen){0};
    zck_report *rep;
    ZT_OK(zfmt_archive_verify(&rep, "big.tar.gz", &prog));
    ZT_CHECK_EQ(zck_report_count(rep), 0);
    ZT_CHECK_EQ(zck_report_bytes_hashed(rep), shard_bytes(p));
    zck_report_free(rep);
    ZT_CHECK(ps.calls >= 1 && !strcmp(ps.what, "verify") && ps.done == ps.total);
    ZT_OK(zfmt_unpack("big.tar.gz", "out", NULL));
    zt_check_content("out", 5);
    free(p);
}

ZT_TEST(archive_unpack_latest_only_moves_forward)
{
    char *p7 = fresh("run", 7, 42), *p9 = fresh("run", 9, 43);
    ZT_OK(zfmt_pack(p7, "a7.tar", NULL));
    ZT_OK(zfmt_pack(p9, "a9.tar.gz", NULL));
    char *lp;
    /* newer first: the older one arrives but latest stays */
    ZT_OK(zfmt_unpack("a9.tar.gz", "out", NULL));
    ZT_OK(zfmt_unpack("a7.tar", "out", NULL));
    ZT_OK(zck_latest(&lp, "out"));
    ZT_CHECK(!strcmp(lp, "out/step-00000009"));
    free(lp);
    zt_check_content("out/step-00000007", 42);
    zt_check_content("out", 43);
    /* older first: latest follows the newer one */
    ZT_OK(zfmt_unpack("a7.tar", "out2", NULL));
    ZT_OK(zfmt_unpack("a9.tar.gz", "out2", NULL));
    ZT_OK(zck_latest(&lp, "out2"));
    ZT_CHECK(!strcmp(lp, "out2/step-00000009"));
    free(lp);
    /* an existing step directory is never replaced */
    ZT_ERR(zfmt_unpack("a7.tar", "out", NULL), ZR_EEXIST, "step-00000007");
    EXPECT_ENTRIES("out", 3);
    zt_check_content("out/step-00000007", 42);
    free(p7);
    free(p9);
}

ZT_TEST(archive_pack_refusals)
{
    char *p = fresh("run", 7, 42);
    zt_write_file("ck.tar", "precious");
    ZT_ERR(zfmt_pack(p, "ck.tar", NULL), ZR_EEXIST, "ck.tar");
    char *txt;
    ZT_OK(zck__read_small_for_tests(&txt, "ck.tar"));
    ZT_CHECK(!strcmp(txt, "precious"));
    free(txt);
    ZT_ERR(zfmt_pack(p, "ck.zip", NULL), ZR_EINVAL, "ck.zip");
    ZT_ERR(zfmt_pack("nowhere", "x.tar", NULL), ZR_ENOTFOUND, "nowhere");
    /* a shard whose size disagrees with the manifest: no archive, no temporary file */
    char shard[256];
    snprintf(shard, sizeof shard, "%s/shard-00001-of-00003.bin", p);
    zt_truncate(shard, 100);
    ZT_ERR(zfmt_pack(p, "bad.tar.gz", NULL), ZR_ECORRUPT, "shard-00001-of-00003.bin");
    EXPECT_ENTRIES(".", 2); /* run and ck.tar */
    free(p);
}

/* ---------------------------------------------------------------- verification */

ZT_TEST(archive_verify_flipped_byte_and_unpack_refuses)
{
    char *p = fresh("run", 7, 42);
    ZT_OK(zfmt_pack(p, "ck.tar", NULL));
    size_t off = header_offset("ck.tar", "step-00000007/shard-00001-of-00003.bin");
    zt_flip_byte("ck.tar", off + 512 + 100); /* inside the member's data */
    expect_one("ck.tar", ZCK_PROB_HASH, "shard-00001-of-00003.bin", "sha256");
    ZT_ERR(zfmt_unpack("ck.tar", "out", NULL), ZR_ECORRUPT, "shard-00001-of-00003.bin");
    ZT_CHECK(strstr(zr_err_msg(), "hash mismatch"));
    EXPECT_ENTRIES("out", 0);
    free(p);
}

ZT_TEST(archive_verify_missing_extra_and_misplaced_members)
{
    char *p = fresh("run", 7, 42);
    const char *top = "step-00000007";
    const char *shards[] = {"shard-00000-of-00003.bin", "shard-00001-of-00003.bin",
                            "shard-00002-of-00003.bin"};
    /* one shard left out */
    struct archive *a = tar_open("missing.tar", 0);
    tar_add_file(a, p, top, "manifest.json");
    tar_add_file(a, p, top, "SHA256SUMS");
    tar_add_file(a, p, top, shards[0]);
    tar_add_file(a, p, top, shards[2]);
    tar_close(a);
    expect_one("missing.tar", ZCK_PROB_MISSING, shards[1], "not in the archive");
    ZT_ERR(zfmt_unpack("missing.tar", "out", NULL), ZR_ECORRUPT, shards[1]);
    EXPECT_ENTRIES("out", 0);
    /* one member too many */
    a = tar_open("extra.tar", 0);
    tar_add_file(a, p, top, "manifest.json");
    tar_add_file(a, p, top, "SHA256SUMS");
    for (int i = 0; i < 3; i++)
        tar_add_file(a, p, top, shards[i]);
    tar_add_text(a, "step-00000007/extra.bin", "surprise");
    tar_close(a);
    expect_one("extra.tar", ZCK_PROB_UNLISTED, "extra.bin", "not named by the manifest");
    ZT_ERR(zfmt_unpack("extra.tar", "out", NULL), ZR_ECORRUPT, "extra.bin");
    EXPECT_ENTRIES("out", 0);
    /* the manifest after the shards: reported, though each file is intact */
    a = tar_open("late.tar", 0);
    for (int i = 0; i < 3; i++)
        tar_add_file(a, p, top, shards[i]);
    tar_add_file(a, p, top, "SHA256SUMS");
    tar_add_file(a, p, top, "manifest.json");
    tar_close(a);
    expect_one("late.tar", ZCK_PROB_MANIFEST, "manifest.json", "must start with");
    /* a manifest edited after the commit disagrees with SHA256SUMS */
    char *mtext, mpath[256];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", p);
    ZT_OK(zck__read_small_for_tests(&mtext, mpath));
    char *at = strstr(mtext, "\"producer\": \"zero ");
    ZT_CHECK(at);
    at[13] = 'Z';
    a = tar_open("edited.tar", 0);
    tar_add_text(a, "step-00000007/manifest.json", mtext);
    tar_add_file(a, p, top, "SHA256SUMS");
    for (int i = 0; i < 3; i++)
        tar_add_file(a, p, top, shards[i]);
    tar_close(a);
    expect_one("edited.tar", ZCK_PROB_SUMS, "manifest.json", "edited after the commit");
    free(mtext);
    /* intact files under a directory name that is not the step's */
    a = tar_open("renamed.tar", 0);
    tar_add_file(a, p, "step-7", "manifest.json");
    tar_add_file(a, p, "step-7", "SHA256SUMS");
    for (int i = 0; i < 3; i++)
        tar_add_file(a, p, "step-7", shards[i]);
    tar_close(a);
    expect_one("renamed.tar", ZCK_PROB_MANIFEST, "manifest.json", "expected step-00000007/");
    ZT_ERR(zfmt_unpack("renamed.tar", "out", NULL), ZR_ECORRUPT, "expected step-00000007/");
    ZT_CHECK(!exists("out"));
    free(p);
}

ZT_TEST(archive_verify_unreadable_inputs)
{
    zck_report *rep;
    ZT_ERR(zfmt_archive_verify(&rep, "absent.tar", NULL), ZR_ENOTFOUND, "absent.tar");
    zt_write_file("text.tar", "this is not an archive, only some text that goes on a while\n");
    ZT_ERR(zfmt_archive_verify(&rep, "text.tar", NULL), ZR_ECORRUPT, "text.tar");
    ZT_ERR(zfmt_unpack("text.tar", "out", NULL), ZR_ECORRUPT, "text.tar");
    EXPECT_ENTRIES("out", 0);
    /* a compressed archive cut in half: a report or an error, never a crash or a checkpoint */
    char *p = fresh("run", 7, 42);
    ZT_OK(zfmt_pack(p, "ck.tar.gz", NULL));
    struct stat st;
    ZT_CHECK(stat("ck.tar.gz", &st) == 0);
    zt_truncate("ck.tar.gz", (uint64_t)st.st_size / 2);
    zr_err_clear();
    int rc = zfmt_archive_verify(&rep, "ck.tar.gz", NULL);
    if (rc == 0) {
        ZT_CHECK(zck_report_count(rep) > 0);
        zck_report_free(rep);
    } else {
        ZT_CHECK_EQ(rc, ZR_ECORRUPT);
    }
    ZT_ERR(zfmt_unpack("ck.tar.gz", "out", NULL), ZR_ECORRUPT, "ck.tar.gz");
    EXPECT_ENTRIES("out", 0);
    free(p);
}

/* ---------------------------------------------------------------- hostile archives */

/* Each archive starts with a harmless member, so that extraction has begun when the attack
 * comes and the temporary directory must be cleaned up. */
static struct archive *evil_open(const char *path)
{
    struct archive *a = tar_open(path, 0);
    tar_add_text(a, "step-00000001/manifest.json", "{}");
    return a;
}

/* An archive of step-00000001/manifest.json (with_manifest) then member, a file holding text,
 * must be refused naming member for reason. */
static void refuse_text(const char *arc, int with_manifest, const char *member, const char *text,
                        const char *reason)
{
    struct archive *a = with_manifest ? evil_open(arc) : tar_open(arc, 0);
    tar_add_text(a, member, text);
    tar_close(a);
    expect_refused(arc, member, reason);
}

/* The same with member an entry of type (a device, a FIFO, a directory), after the manifest. */
static void refuse_entry(const char *arc, unsigned type, const char *member, const char *reason)
{
    struct archive *a = evil_open(arc);
    tar_add(a, member, type, NULL, 0, NULL, 0);
    tar_close(a);
    expect_refused(arc, member, reason);
}

ZT_TEST(archive_evil_absolute_path)
{
    char cwd[4096], abs1[4200], abs2[200];
    ZT_CHECK(getcwd(cwd, sizeof cwd));
    snprintf(abs1, sizeof abs1, "%s/abs-target", cwd);
    snprintf(abs2, sizeof abs2, "/tmp/zt-archive-%ld-x", (long)getpid());
    refuse_text("abs1.tar", 1, abs1, "pwned", "absolute path");
    ZT_CHECK(!exists(abs1));
    refuse_text("abs2.tar", 0, abs2, "pwned", "absolute path");
    ZT_CHECK(!exists(abs2));
}

ZT_TEST(archive_evil_dotdot)
{
    refuse_text("dd.tar", 1, "step-00000001/../../evil", "pwned", "'..'");
    ZT_CHECK(!exists("evil") && !exists("out/evil"));
    refuse_text("dd2.tar", 0, "../evil", "pwned", "'..'");
    ZT_CHECK(!exists("evil") && !exists("../evil"));
}

ZT_TEST(archive_evil_symlink)
{
    char cwd[4096], target[4200];
    ZT_CHECK(getcwd(cwd, sizeof cwd));
    snprintf(target, sizeof target, "%s/target", cwd);
    /* a link out of the run directory, then a file written through it */
    struct archive *a = evil_open("sym.tar");
    tar_add(a, "step-00000001/shard.bin", AE_IFLNK, target, 0, NULL, 0);
    tar_add_text(a, "step-00000001/shard.bin", "pwned");
    tar_close(a);
    expect_refused("sym.tar", "step-00000001/shard.bin", "symbolic link");
    ZT_CHECK(!exists("target"));
    /* the step directory itself as a link */
    a = tar_open("symdir.tar", 0);
    tar_add(a, "step-00000001", AE_IFLNK, "..", 0, NULL, 0);
    tar_add_text(a, "step-00000001/evil", "pwned");
    tar_close(a);
    expect_refused("symdir.tar", "step-00000001", "symbolic link");
    ZT_CHECK(!exists("evil"));
}

ZT_TEST(archive_evil_hardlink)
{
    char cwd[4096], victim[4200];
    ZT_CHECK(getcwd(cwd, sizeof cwd));
    snprintf(victim, sizeof victim, "%s/victim", cwd);
    zt_write_file("victim", "original");
    struct archive *a = evil_open("hard.tar");
    tar_add(a, "step-00000001/hl", AE_IFREG, victim, 1, NULL, 0);
    tar_add_text(a, "step-00000001/hl", "overwritten");
    tar_close(a);
    expect_refused("hard.tar", "step-00000001/hl", "hard link");
    char *txt;
    ZT_OK(zck__read_small_for_tests(&txt, "victim"));
    ZT_CHECK(!strcmp(txt, "original"));
    free(txt);
    struct stat st;
    ZT_CHECK(stat("victim", &st) == 0 && st.st_nlink == 1);
}

ZT_TEST(archive_evil_device_and_fifo)
{
    refuse_entry("dev.tar", AE_IFCHR, "step-00000001/null", "character device");
    refuse_entry("fifo.tar", AE_IFIFO, "step-00000001/pipe", "fifo");
}

ZT_TEST(archive_evil_huge_size)
{
    struct archive *a = tar_open("huge.tar", 1);
    tar_add_text(a, "step-00000001/manifest.json", "{}");
    tar_add_text(a, "step-00000001/big.bin", "");
    tar_close(a);
    patch_size("huge.tar", "step-00000001/big.bin", (uint64_t)1 << 60);
    expect_refused("huge.tar", "step-00000001/big.bin", "out of range");
}

ZT_TEST(archive_evil_two_top_directories)
{
    refuse_text("two.tar", 1, "step-00000002/manifest.json", "{}", "second top directory");
    ZT_CHECK(!exists("out/step-00000002"));
    /* a file beside the step directory, and a top directory that is not a step */
    refuse_text("beside.tar", 1, "latest", "step-00000001\n",
                "not inside a step-<digits> directory");
    refuse_text("other.tar", 0, "stuff/manifest.json", "{}",
                "not inside a step-<digits> directory");
}

ZT_TEST(archive_evil_nested_directory)
{
    refuse_entry("nest.tar", AE_IFDIR, "step-00000001/sub/", "nested directory");
    refuse_text("nest2.tar", 1, "step-00000001/sub/x", "deep", "nested directory");
    refuse_text("hidden.tar", 1, "step-00000001/.hidden", "x", "not a plain file name");
    /* the same file twice: the second copy is refused, not written over the first */
    refuse_text("dup.tar", 1, "step-00000001/manifest.json", "{\"again\": 1}", "appears twice");
}

/* A member larger than its limit is refused from its tar header, before any of its data is
 * read (a 2 GiB manifest.json of zeros in a 2 MB .tar.gz was read and written out whole, 11 s,
 * then refused): the member, the size its header gives and the limit named. Here the headers
 * promise more data than the archives hold, so an unpack that read the data would fail on the
 * truncated archive instead. */
ZT_TEST(archive_unpack_refuses_oversized_member_from_its_header)
{
    struct archive *a = tar_open("big.tar", 1);
    tar_add_text(a, "step-00000001/manifest.json", "{}");
    tar_close(a);
    patch_size("big.tar", "step-00000001/manifest.json", (uint64_t)2 << 30);
    ZT_CHECK(system("gzip -c big.tar > big.tar.gz") == 0);
    ZT_ERR(zfmt_unpack("big.tar.gz", "out", NULL), ZR_ECORRUPT, "'step-00000001/manifest.json'");
    const char *m = zr_err_msg();
    if (!strstr(m, "2147483648 bytes (its tar header)") || !strstr(m, "67108864") ||
        !strstr(m, "refused before reading"))
        ZT_FAIL("message '%s' lacks the size, the limit or the refusal", m);
    ZT_CHECK(!exists("out"));

    /* a shard larger than the size the manifest (unpacked first, as pack writes it) lists */
    char *p = fresh("run", 4, 2);
    char shard[64];
    snprintf(shard, sizeof shard, "step-00000004/shard-00001-of-00003.bin");
    a = tar_open("shard.tar", 1);
    tar_add_file(a, p, "step-00000004", "manifest.json");
    tar_add_file(a, p, "step-00000004", "SHA256SUMS");
    tar_add_file(a, p, "step-00000004", "shard-00001-of-00003.bin");
    tar_close(a);
    char listed[96], path[512];
    struct stat st;
    snprintf(path, sizeof path, "%s/shard-00001-of-00003.bin", p);
    ZT_CHECK(stat(path, &st) == 0);
    snprintf(listed, sizeof listed, "more than the %lld the manifest lists",
             (long long)st.st_size);
    patch_size("shard.tar", shard, (uint64_t)1 << 40);
    expect_refused("shard.tar", shard, "1099511627776 bytes (its tar header)");
    ZT_ERR(zfmt_unpack("shard.tar", "out", NULL), ZR_ECORRUPT, listed);
    ZT_CHECK(!exists("out"));
    free(p);
}

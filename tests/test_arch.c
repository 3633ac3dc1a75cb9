/*
 * test_arch.c: the architecture, measured (issue 14). arch_checks runs the three tools of
 * tests/arch/ against the repository (ZT_ROOT) and the objects of the build that made this
 * runner: no forbidden include and a current picture in docs/ARCHITECTURE.md (deps.py --check),
 * no circle between objects (cycles.sh), no function over 150 lines (longfn.sh), each modulo
 * tests/arch/allow.txt, whose stale entries fail too. The other tests give each tool a small
 * tree with known offenders, so that a tool that stopped finding them fails here.
 */
#include "ckutil.h"

#include <sys/stat.h>
#include <sys/wait.h>

/* run cmd with its output in log; the exit status (-1: did not exit) */
static int arch_run(const char *cmd, const char *log)
{
    char full[8192];
    snprintf(full, sizeof full, "%s > %s 2>&1", cmd, log);
    int st = system(full);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* cmd must exit with want and print every one of the NULL-terminated texts */
static void arch_expect(const char *cmd, int want, const char *const *texts)
{
    int rc = arch_run(cmd, "arch.log");
    char *out = zt_slurp("arch.log");
    if (rc != want)
        ZT_FAIL("%s: exit %d, expected %d; output:\n%s", cmd, rc, want, out);
    for (size_t i = 0; texts && texts[i]; i++)
        if (!strstr(out, texts[i]))
            ZT_FAIL("%s: output lacks '%s'; output:\n%s", cmd, texts[i], out);
    free(out);
}

/* write text to path (relative to the test's directory), creating its folders */
static void arch_put(const char *path, const char *text)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    ZT_CHECK(system(cmd) == 0);
    zt_write_file(path, text);
}

/* A tool's allowlist (cmd reads allow.txt): holding allow, cmd passes and prints every one of
 * the NULL-terminated texts allowed; with stale_entry added (an entry that no longer
 * offends), it fails and prints stale. */
static void arch_expect_allowlist(const char *cmd, const char *allow,
                                  const char *const *allowed, const char *stale_entry,
                                  const char *stale)
{
    arch_put("allow.txt", allow);
    arch_expect(cmd, 0, allowed);
    char both[4096];
    snprintf(both, sizeof both, "%s%s", allow, stale_entry);
    arch_put("allow.txt", both);
    arch_expect(cmd, 1, (const char *[]){stale, NULL});
}

static int arch_have(const char *prog)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

/* the build directory: the one this runner was linked in ($(BUILD)/zt) */
static void arch_build_dir(char *out, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", out, cap - 1);
    ZT_CHECK(n > 0);
    out[n] = 0;
    char *slash = strrchr(out, '/');
    ZT_CHECK(slash);
    *slash = 0;
}

ZT_TEST(arch_checks)
{
    const char *root = zt_root();
    char build[2048];
    arch_build_dir(build, sizeof build);
    int bad = 0;
    struct {
        const char *what;
        char cmd[12288];
    } tool[3];
    snprintf(tool[0].cmd, sizeof tool[0].cmd, "sh %s/tests/arch/cycles.sh --allow "
             "%s/tests/arch/allow.txt %s", root, root, build);
    tool[0].what = "cycles.sh";
    snprintf(tool[1].cmd, sizeof tool[1].cmd, "sh %s/tests/arch/longfn.sh --root %s --allow "
             "%s/tests/arch/allow.txt", root, root, root);
    tool[1].what = "longfn.sh";
    snprintf(tool[2].cmd, sizeof tool[2].cmd, "python3 %s/tests/arch/deps.py --root %s --check "
             "--allow %s/tests/arch/allow.txt", root, root, root);
    tool[2].what = "deps.py";
    int n = arch_have("python3") ? 3 : 2;
    /* every tool runs, so that one failure shows everything that is wrong */
    for (int i = 0; i < n; i++) {
        int rc = arch_run(tool[i].cmd, "arch.log");
        char *out = zt_slurp("arch.log");
        if (rc != 0) {
            fprintf(stderr, "  %s: exit %d (%s):\n%s", tool[i].what, rc, tool[i].cmd, out);
            bad++;
        }
        free(out);
    }
    if (bad)
        ZT_FAIL("%d of the architecture checks failed (fix, or see tests/arch/allow.txt)", bad);
    if (n < 3)
        ZT_SKIP("no python3: the include rules (tests/arch/deps.py) were not checked");
}

/* a tree with a Makefile, a forbidden include, a relative include, a cli/ include of an
 * internal header, an umbrella header that gathers an internal one and a stale picture */
static void arch_deps_tree(void)
{
    arch_put("Makefile", "INC_ckpt := -Ickpt\n"
                         "INC_model := -Icore/model -Ickpt -Icore/zero\n"
                         "INC_dist := -Icore/dist -Ickpt\n"
                         "INC_zero := -Icore/zero -Icore/model -Ickpt\n"
                         "INC_cli := -Icli -Icore -Ickpt\n");
    arch_put("ckpt/zck.h", "#include <stdio.h>\n");
    arch_put("ckpt/a.c", "#include \"zck.h\"\n");
    arch_put("core/model/model.h", "#include \"zck.h\"\n");
    arch_put("core/model/bad.c", "#include \"model.h\"\n/* below */\n#include \"zero.h\"\n");
    arch_put("core/zero/zero.h", "#include \"model.h\"\n");
    arch_put("core/zero/zero.c", "#include <zero.h>\n");
    arch_put("core/dist/rel.c", "#include \"zck.h\"\n#include \"../model/model.h\"\n");
    arch_put("cli/x.c", "#include \"zck.h\"\n#include \"model/model.h\"\n#include \"zr.h\"\n");
    arch_put("core/zr.h", "#include \"model/model.h\"\n#include \"model/par.h\"\n");
    arch_put("core/model/par.h", "#include \"model.h\"\n");
    arch_put("docs/ARCHITECTURE.md", "# a\n\n<!-- deps:begin -->\nold\n<!-- deps:end -->\n\nend\n");
}

ZT_TEST(arch_deps_finds_offenders)
{
    if (!arch_have("python3"))
        ZT_SKIP("no python3");
    arch_deps_tree();
    char deps[4096], cmd[8192];
    snprintf(deps, sizeof deps, "python3 %s/tests/arch/deps.py --root .", zt_root());
    snprintf(cmd, sizeof cmd, "%s --check", deps);
    arch_expect(cmd, 1, (const char *[]){
        "forbidden: core/model/bad.c:3: core/model includes core/zero/zero.h: core/model may use "
        "only: ckpt",
        "forbidden: core/dist/rel.c:2: relative include \"../model/model.h\"",
        "forbidden: core/dist/rel.c:2: core/dist includes core/model/model.h",
        "forbidden: cli/x.c:2: cli includes core/model/model.h",
        "forbidden: core/zr.h:2: core includes core/model/par.h: core/zr.h may gather only",
        "picture in docs/ARCHITECTURE.md is stale", "5 forbidden includes", NULL});
    /* --write draws the arrows, the forbidden one included; the rest of the page stays */
    snprintf(cmd, sizeof cmd, "%s --write", deps);
    arch_expect(cmd, 1, (const char *[]){"rewrote the picture", NULL});
    char *doc = zt_slurp("docs/ARCHITECTURE.md");
    ZT_CHECK(strstr(doc, "core_model -->|\"zero.h\"| core_zero"));
    ZT_CHECK(strstr(doc, "core_zero -->|\"model.h\"| core_model"));
    ZT_CHECK(strstr(doc, "cli -->|\"model.h\"| core_model"));
    ZT_CHECK(strstr(doc, "cli -->|\"zr.h\"| core\n"));
    ZT_CHECK(strstr(doc, "core -->|\"model.h par.h\"| core_model"));
    ZT_CHECK(strncmp(doc, "# a\n\n<!-- deps:begin -->\n", 25) == 0);
    ZT_CHECK(strstr(doc, "<!-- deps:end -->\n\nend\n"));
    ZT_CHECK(!strstr(doc, "old"));
    free(doc);
    /* the offenders, allowed by name, pass; an entry that no longer offends fails */
    snprintf(cmd, sizeof cmd, "%s --check --allow allow.txt", deps);
    arch_expect_allowlist(cmd,
                          "include core/model/bad.c core/zero/zero.h\n"
                          "relative core/dist/rel.c ../model/model.h  # a comment\n"
                          "include core/dist/rel.c core/model/model.h\n"
                          "include cli/x.c core/model/model.h\n"
                          "include core/zr.h core/model/par.h\n",
                          (const char *[]){"allowed: core/model/bad.c:3",
                                           "0 forbidden includes (5 allowed)", NULL},
                          "include core/zero/zero.c core/model/model.h\n",
                          "allow.txt:6: stale allowlist entry, no longer offends: "
                          "include core/zero/zero.c core/model/model.h");
    /* a folder the Makefile gives no include paths is an error, not a silent pass */
    arch_put("formats/y.c", "#include \"zck.h\"\n");
    arch_expect(cmd, 2, (const char *[]){"the Makefile has no INC_formats", NULL});
}

/* a function of n lines, from its return type to its closing brace, with braces that do not
 * count (comments, strings, characters) */
static void arch_fn(FILE *f, const char *name, int n)
{
    fprintf(f, "static int\n%s(int a)\n{\n", name);
    fprintf(f, "    const char *s = \"}}\"; /* } */\n    char c = '}';\n    // }\n");
    for (int i = 0; i < n - 8; i++)
        fprintf(f, "    a += %d;\n", i);
    fprintf(f, "    return a + s[0] + c;\n}\n");
}

ZT_TEST(arch_longfn_finds_offenders)
{
    arch_put("core/model/long.c", "#include <stdio.h>\n");
    FILE *f = fopen("core/model/long.c", "a");
    ZT_CHECK(f);
    fputs("struct s { int x; };\nstatic const int tbl[] = {\n    1,\n};\n", f);
    arch_fn(f, "f150", 150);
    fputs("#define M(x) \\\n    { x }\n", f);
    arch_fn(f, "f151", 151);
    fputs("void one(void) { }\n", f);
    fclose(f);
    char tool[4096], cmd[8192];
    snprintf(tool, sizeof tool, "sh %s/tests/arch/longfn.sh --root .", zt_root());
    arch_expect(tool, 1, (const char *[]){"too long: core/model/long.c:158: f151: 151 lines (max "
                                          "150)", "1 functions over 150 lines (0 allowed)", NULL});
    zt_file_lacks("arch.log", "f150");
    snprintf(cmd, sizeof cmd, "%s --max 149", tool);
    arch_expect(cmd, 1, (const char *[]){"core/model/long.c:6: f150: 150 lines",
                                         "2 functions over 149 lines", NULL});
    snprintf(cmd, sizeof cmd, "%s --allow allow.txt", tool);
    arch_expect_allowlist(cmd, "longfn core/model/long.c f151\n",
                          (const char *[]){"allowed: core/model/long.c:158: f151", NULL},
                          "longfn core/model/long.c f150\n",
                          "allow.txt:2: stale allowlist entry, no longer over 150 lines: "
                          "longfn core/model/long.c f150");
}

ZT_TEST(arch_cycles_finds_offenders)
{
    if (!arch_have("cc") || !arch_have("nm"))
        ZT_SKIP("no cc or nm");
    /* ckpt: a <-> b, c -> a; formats: alone; core: x -> y only */
    arch_put("src/a.c", "int b_fn(void);\nint a_fn(void) { return b_fn(); }\n");
    arch_put("src/b.c", "int a_fn(void);\nint b_fn(void) { return 1; }\n"
                        "int b_other(void) { return a_fn(); }\n");
    arch_put("src/c.c", "int a_fn(void);\nint c_fn(void) { return a_fn(); }\n");
    arch_put("src/f.c", "int f_fn(void) { return 0; }\n");
    arch_put("src/x.c", "int y_fn(void);\nint x_fn(void) { return y_fn(); }\n");
    arch_put("src/y.c", "int a_fn(void);\nint y_fn(void) { return a_fn(); }\n");
    ZT_CHECK(system("mkdir -p obj/ckpt obj/formats obj/core/z && "
                    "cc -c src/a.c -o obj/ckpt/a.o && cc -c src/b.c -o obj/ckpt/b.o && "
                    "cc -c src/c.c -o obj/ckpt/c.o && cc -c src/f.c -o obj/formats/f.o && "
                    "cc -c src/x.c -o obj/core/z/x.o && cc -c src/y.c -o obj/core/z/y.o") == 0);
    char tool[4096], cmd[8192];
    snprintf(tool, sizeof tool, "sh %s/tests/arch/cycles.sh", zt_root());
    snprintf(cmd, sizeof cmd, "%s obj", tool);
    arch_expect(cmd, 1, (const char *[]){"circle in ckpt: ckpt/a.o ckpt/b.o\n",
                                         "    ckpt/a.o -> ckpt/b.o: b_fn\n",
                                         "    ckpt/b.o -> ckpt/a.o: a_fn\n",
                                         "cycles: 1 circles", NULL});
    char *out = zt_slurp("arch.log");
    ZT_CHECK(!strstr(out, "c.o") && !strstr(out, "core/"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s --allow allow.txt obj", tool);
    arch_expect_allowlist(cmd, "# known\ncycle ckpt ckpt/a.o ckpt/b.o\n",
                          (const char *[]){"allowed: circle in ckpt: ckpt/a.o ckpt/b.o", NULL},
                          "cycle core core/z/x.o core/z/y.o\n",
                          "allow.txt:3: stale allowlist entry, no longer a circle: "
                          "cycle core core/z/x.o core/z/y.o");
    /* a library without objects is an error: nothing was measured */
    ZT_CHECK(system("rm -r obj/formats") == 0);
    arch_expect(cmd, 2, (const char *[]){"no objects in obj/formats", NULL});
}

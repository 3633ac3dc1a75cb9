/*
 * opts.h: the command-line options of a program declared once, as a table (name, kind, range,
 * default, help text, where the value goes), from which both the parsing of argv and the
 * `--help` text are made. zrun has one table; each zckpt subcommand has its own small one,
 * sharing the entries of common options. Values go into the program's own argument struct:
 * each entry names the offset of its field (offsetof), so a table is a static constant.
 */
#ifndef ZCLI_OPTS_H
#define ZCLI_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    ZCLI_OPT_SECTION,  /* not an option: a heading of the --help list ("checkpoints:") */
    ZCLI_OPT_FLAG,     /* no value: stores flag_value (an int) */
    ZCLI_OPT_U32,      /* uint32_t (or unsigned) within [lo, hi] */
    ZCLI_OPT_INT,      /* int within [lo, hi] */
    ZCLI_OPT_U64,      /* uint64_t within [lo, hi], a multiple of `multiple` when set */
    ZCLI_OPT_ZU,       /* size_t as a plain integer, as ZCLI_OPT_U64 */
    ZCLI_OPT_BYTES,    /* size_t from a size such as 4096, 64K, 256M, 1G */
    ZCLI_OPT_FLOAT,    /* float within [flo, fhi] */
    ZCLI_OPT_DOUBLE,   /* double within [flo, fhi] */
    ZCLI_OPT_STRING,   /* const char *, borrowed from argv */
    ZCLI_OPT_ENUM,     /* int: values[k] for the name choices[k] */
} zcli_opt_kind;

/* flags: a required option (the parser says "missing -o OUT" when absent); a positional
 * argument (a STRING named by its placeholder, "CKPT"; always required, filled in order) */
enum { ZCLI_OPT_REQUIRED = 1, ZCLI_OPT_POSITIONAL = 2, ZCLI_OPT_REPEAT = 4 };

/* A repeated positional (ZCLI_POSITIONALS, "FILE..."): every remaining argument, in order,
 * borrowed from argv; v is malloc'ed by the parser (zcli_list_free). At least one is required. */
typedef struct {
    const char **v;
    size_t n;
} zcli_list;
void zcli_list_free(zcli_list *l);

typedef struct {
    const char *name;      /* "--seed"; a positional's placeholder; a section's heading */
    const char *alias;     /* another spelling ("--output" of "-o"), or NULL */
    zcli_opt_kind kind;
    unsigned flags;        /* ZCLI_OPT_REQUIRED, ZCLI_OPT_POSITIONAL */
    size_t off;            /* where the value goes: offsetof in the program's argument struct */
    const char *meta;      /* the value's placeholder in help ("N"); enums: NULL, the choices */
    uint64_t lo, hi;       /* integer kinds: the range */
    uint64_t multiple;     /* ZCLI_OPT_U64, ZCLI_OPT_ZU: 0, or the value's required multiple */
    double flo, fhi;       /* ZCLI_OPT_FLOAT, ZCLI_OPT_DOUBLE: the range */
    const char *const *choices; /* ZCLI_OPT_ENUM: the names, NULL-terminated */
    const int *values;     /* ZCLI_OPT_ENUM: the value stored for each name */
    int flag_value;        /* ZCLI_OPT_FLAG: the value stored (ZCLI_FLAG: 1) */
    const char *def;       /* default shown by --help; NULL: read from the defaults struct;
                              "": none shown */
    const char *help;      /* one paragraph, wrapped by --help */
} zcli_opt;

/* Table entries, in the file that defines ZCLI_ARGS as its argument struct. d is the default
 * --help shows (NULL: the value in the defaults struct). */
#define ZCLI_SECTION(heading) {.name = heading, .kind = ZCLI_OPT_SECTION}
#define ZCLI_INTEGER(k, nm, fld, mt, l, h, d, txt)                                              \
    {.name = nm, .kind = ZCLI_OPT_##k, .off = offsetof(ZCLI_ARGS, fld), .meta = mt, .lo = l,  \
     .hi = h, .def = d, .help = txt}
#define ZCLI_REAL(k, nm, fld, mt, l, h, d, txt)                                                 \
    {.name = nm, .kind = ZCLI_OPT_##k, .off = offsetof(ZCLI_ARGS, fld), .meta = mt, .flo = l, \
     .fhi = h, .def = d, .help = txt}
#define ZCLI_STRING(nm, fld, mt, d, txt)                                                        \
    {.name = nm, .kind = ZCLI_OPT_STRING, .off = offsetof(ZCLI_ARGS, fld), .meta = mt,        \
     .def = d, .help = txt}
#define ZCLI_ENUM(nm, fld, names, vals, d, txt)                                                 \
    {.name = nm, .kind = ZCLI_OPT_ENUM, .off = offsetof(ZCLI_ARGS, fld), .choices = names,    \
     .values = vals, .def = d, .help = txt}
#define ZCLI_FLAG(nm, fld, txt)                                                                 \
    {.name = nm, .kind = ZCLI_OPT_FLAG, .off = offsetof(ZCLI_ARGS, fld), .flag_value = 1,     \
     .help = txt}
#define ZCLI_POSITIONAL(nm, fld)                                                                \
    {.name = nm, .kind = ZCLI_OPT_STRING, .flags = ZCLI_OPT_POSITIONAL,                       \
     .off = offsetof(ZCLI_ARGS, fld)}

#define ZCLI_POSITIONALS(nm, fld)                                                               \
    {.name = nm, .kind = ZCLI_OPT_STRING, .flags = ZCLI_OPT_POSITIONAL | ZCLI_OPT_REPEAT,       \
     .off = offsetof(ZCLI_ARGS, fld)}

/* A program's (or a zckpt subcommand's) table and how its usage errors are worded. */
typedef struct {
    const char *prog;      /* "zrun", "zckpt" */
    const char *cmd;       /* zckpt's subcommand ("verify"), or NULL */
    const zcli_opt *opt;
    size_t n;
} zcli_opts;

/* zcli_opts_parse's answer when argv asks for --help (or -h); nothing is printed. */
#define ZCLI_OPTS_HELP (-1)

/* Parse argv[1..argc) into base (the argument struct, holding the defaults already). Returns 0;
 * ZCLI_OPTS_HELP; or ZCLI_ERROR after printing the error: a bad value names the option and
 * what it accepts; a usage error (unknown option, missing value or argument) is followed by
 * where the usage is. */
int zcli_opts_parse(const zcli_opts *p, void *base, int argc, char **argv);

/* Set the option `name` from text as if it were given on the command line (a default from the
 * environment, say); 0, or ZCLI_ERROR after printing the error. */
int zcli_opts_set(const zcli_opts *p, void *base, const char *name, const char *text);

/* The synopsis of the arguments ("CKPT --world N -o OUT [--buffer SIZE] [--force]"). */
void zcli_opts_synopsis(FILE *f, const zcli_opts *p);

/* A subcommand of a program of subcommands (zckpt, ztok): its name, what runs it (fn takes
 * the program's argument struct), its option table and its help text. */
typedef struct {
    const char *name;
    int (*fn)(const void *args);
    const zcli_opt *opt;
    size_t n_opt;
    const char *help;
} zcli_command;
#define ZCLI_TABLE(t) t, sizeof t / sizeof *t
zcli_opts zcli_command_opts(const char *prog, const zcli_command *c);
/* The command of the table named name, or NULL after "PROG: error: unknown command 'NAME'" on
 * stderr. */
const zcli_command *zcli_command_find(const char *prog, const zcli_command *c, size_t n,
                                      const char *name);
/* "--help" or "-h" */
bool zcli_is_help(const char *arg);
/* "usage: PROG COMMAND [ARGS]", the summary, each command's line, then "`PROG COMMAND --help`
 * explains one. " and the footer. */
void zcli_commands_usage(FILE *f, const char *prog, const char *summary,
                         const zcli_command *c, size_t n, const char *footer);

/* Programs of subcommands (zckpt, ztok): the line "  CMD SYNOPSIS" of the command list, and a
 * command's whole --help ("usage: PROG CMD SYNOPSIS", its help text, the option list). */
void zcli_command_line(FILE *f, const zcli_opts *p);
void zcli_command_help(FILE *f, const zcli_opts *p, const char *help, const void *defaults);

/* The option list of --help: each option with its value, help text and default (from def, else
 * read from defaults, a struct holding the defaults), and the section headings. */
void zcli_opts_help(FILE *f, const zcli_opts *p, const void *defaults);

#endif

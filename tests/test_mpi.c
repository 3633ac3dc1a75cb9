/*
 * test_mpi.c: zrun under Open MPI's mpirun (the mpi communicator, core/dist/comm_mpi.c):
 * 2 and 4 ranks, also with shared memory disabled (--mca btl tcp,self, ranks talking as across
 * nodes), give exactly the checkpoints of the shm communicator at the same world; checkpoints
 * written under MPI resume under shm at another world and the reverse, with the bits of the
 * all-shm run; a rank killed ends the job within seconds naming it, `latest` sound; the NCCL id
 * of the device path crosses over MPI (hostsim); the options' errors, and a zrun without its
 * MPI backend. Skipped with one line
 * when mpirun is absent (make deps installs it). The collectives themselves (every op, exact
 * bits, a mismatch in the order of calls) are tested in test_comm.c.
 */
#include "ckutil.h"
#include "zr.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SMALL "gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256"
#define COMMON "--model " SMALL " --seq 32 --batch 8 --micro-batch 1 --threads 1 "
#define MPIRUN "mpirun --oversubscribe --allow-run-as-root --bind-to none "

static void need_mpirun(void)
{
    if (system("command -v mpirun >/dev/null 2>&1") != 0)
        ZT_SKIP("no mpirun (make deps installs openmpi-bin)");
    zt_zrun_path();
}

/* the shell command of mpirun -np np [mca] zrun args > log 2>&1 (ZT_MPI_ENV: no leak report
 * under ASan, where Open MPI's components leave their allocations at exit) */
static void mpi_cmd(char *cmd, size_t cap, int np, const char *mca, const char *args,
                    const char *log)
{
    snprintf(cmd, cap, ZT_MPI_ENV "exec timeout 120 " MPIRUN "-np %d %s %s %s > %s 2>&1", np,
             mca, zt_zrun_path(), args, log);
}

/* mpirun ... zrun args: the exit status as a shell gives it */
static int mpi_zrun(int np, const char *mca, const char *args, const char *log)
{
    char cmd[8192];
    mpi_cmd(cmd, sizeof cmd, np, mca, args, log);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void mpi_zrun_ok(int np, const char *mca, const char *args, const char *log)
{
    if (mpi_zrun(np, mca, args, log) != 0)
        ZT_FAIL("mpirun -np %d %s zrun %s failed:\n%s", np, mca, args, zt_slurp(log));
}

ZT_TEST(mpi_zrun_matches_shm_bits)
{
    need_mpirun();
    /* 2 ranks at ZeRO-3 (gathers, reduce-scatters), 4 ranks at ZeRO-1 over TCP only
     * (all-reduces), windows of 4 KiB (every collective in several windows) */
    zt_zrun_ok(COMMON "--steps 5 --zero 3 --nproc 2 --ckpt-dir shm2", "shm2.log");
    mpi_zrun_ok(2, "", COMMON "--steps 5 --zero 3 --ckpt-dir mpi2", "mpi2.log");
    zt_same_latest("shm2", "mpi2", 0, 0);
    zt_file_has("mpi2.log", "done at step 5/5");
    zt_zrun_ok(COMMON "--steps 5 --zero 1 --nproc 4 --ckpt-dir shm4", "shm4.log");
    mpi_zrun_ok(4, "--mca btl tcp,self -x ZR_COMM_MPI_WINDOW=4096",
                COMMON "--steps 5 --zero 1 --ckpt-dir mpi4", "mpi4.log");
    zt_same_latest("shm4", "mpi4", 0, 0);
}

/* written under MPI at 4 ranks, resumed under shm at 2, and the reverse: the bits of the
 * same runs all over shm */
ZT_TEST(mpi_checkpoints_resume_under_shm_and_back)
{
    need_mpirun();
    zt_zrun_ok(COMMON "--steps 3 --zero 2 --nproc 4 --ckpt-dir ref", "r1.log");
    zt_zrun_ok(COMMON "--steps 6 --zero 2 --nproc 2 --ckpt-dir ref", "r2.log");
    mpi_zrun_ok(4, "", COMMON "--steps 3 --zero 2 --ckpt-dir a", "a1.log");
    zt_zrun_ok(COMMON "--steps 6 --zero 2 --nproc 2 --ckpt-dir a", "a2.log");
    zt_same_latest("ref", "a", 0, 0);

    zt_zrun_ok(COMMON "--steps 3 --zero 3 --nproc 2 --ckpt-dir ref2", "s1.log");
    zt_zrun_ok(COMMON "--steps 6 --zero 3 --nproc 4 --ckpt-dir ref2", "s2.log");
    zt_zrun_ok(COMMON "--steps 3 --zero 3 --nproc 2 --ckpt-dir b", "b1.log");
    mpi_zrun_ok(4, "", COMMON "--steps 6 --zero 3 --ckpt-dir b", "b2.log");
    zt_same_latest("ref2", "b", 0, 0);
    zt_file_has("b2.log", "resumed from b/step-00000003");
}

/* the pid of the process of MPI rank `rank` among the descendants of p (mpirun's children) */
static pid_t find_rank(pid_t p, int rank)
{
    pid_t kids[64];
    int n = zt_children(p, kids, 64);
    char want[64];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    for (int i = 0; i < n; i++) {
        char path[64], buf[65536];
        snprintf(path, sizeof path, "/proc/%d/environ", (int)kids[i]);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t o = 0; o < k; o += strlen(buf + o) + 1) {
            buf[k] = 0;
            if (!strcmp(buf + o, want))
                return kids[i];
        }
    }
    return -1;
}

ZT_TEST(mpi_rank_killed_ends_the_job)
{
    need_mpirun();
    char cmd[8192];
    mpi_cmd(cmd, sizeof cmd, 2, "", COMMON "--steps 100000 --save-every 5 --zero 1 "
            "--ckpt-dir run", "job.log");
    pid_t p = zt_spawn_sh(cmd);
    /* p execs timeout, which runs mpirun: the ranks are mpirun's children */
    zt_wait_file_has("job.log", "saved run/step-00000010", 60);
    pid_t mp[4];
    ZT_CHECK(zt_children(p, mp, 4) == 1); /* timeout's child: mpirun */
    pid_t victim = find_rank(mp[0], 1);
    ZT_CHECK(victim > 0);
    ZT_CHECK(kill(victim, SIGKILL) == 0);
    double t1 = zt_now_s();
    int st = zt_wait_status(p);
    double secs = zt_now_s() - t1;
    char *t = zt_slurp("job.log");
    if (st == 0 || st == 124 || secs > 15 || !strstr(t, "process rank 1") || !strstr(t, "signal 9"))
        ZT_FAIL("status %d after %.1f s:\n%s", st, secs, t);
    free(t);
    char vcmd[4096];
    snprintf(vcmd, sizeof vcmd, "%s verify run > verify.log 2>&1", getenv("ZT_ZCKPT"));
    if (getenv("ZT_ZCKPT") && system(vcmd) != 0)
        ZT_FAIL("latest not sound after the kill:\n%s", zt_slurp("verify.log"));
}

/* the device path under mpirun (hostsim, the device table run by the CPU engine): rank 0's
 * NCCL id reaches the others over MPI, and the result has the CPU run's bits */
ZT_TEST(mpi_nccl_id_over_mpi_on_hostsim)
{
    need_mpirun();
    zt_zrun_ok(COMMON "--steps 4 --zero 3 --nproc 2 --ckpt-dir ref", "ref.log");
    mpi_zrun_ok(2, "-x ZR_CUDA_LIB=hostsim -x ZR_DEVICE_COMM=nccl",
                COMMON "--steps 4 --zero 3 --ckpt-dir dev --device cuda", "dev.log");
    char *t = zt_slurp("dev.log");
    ZT_CHECK(strstr(t, "device: hostsim") && strstr(t, "; NCCL"));
    free(t);
    zt_same_latest("ref", "dev", 0, 0);
}

/* What zrun makes of a launcher's environment: only variables, so no mpirun is needed */
ZT_TEST(mpi_option_errors)
{
    static const struct {
        const char *env, *args, *want;
    } bad[] = {
        {"", "--comm mpi", "was not started by mpirun or srun"},
        {"", "--comm tcp --nproc 2", "--comm tcp needs --nnodes > 1"},
        {"OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2", "--nproc 2", "drop --nproc"},
        {"SLURM_PROCID=0 SLURM_NTASKS=2", "--max-restarts 1", "--max-restarts does not apply"},
        {"SLURM_PROCID=0 SLURM_NTASKS=2", "", "srun --mpi=pmix"},
        {"ZR_COMM=nccl", "", "ZR_COMM='nccl': expected mpi"},
        /* the launcher's values, named as the launcher set them */
        {"OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=x", "",
         "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=2", "", "OMPI_COMM_WORLD_RANK"},
        {"SLURM_PROCID=0 SLURM_NTASKS=two", "", "SLURM_NTASKS"},
        /* a size without its rank is not that launcher: ignored, the next error is reached */
        {"SLURM_NTASKS=two OMPI_COMM_WORLD_SIZE=0", "--comm tcp --nproc 2",
         "--comm tcp needs --nnodes > 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[512];
        snprintf(args, sizeof args, COMMON "--steps 2 --ckpt-dir e %s", bad[i].args);
        pid_t p = zt_spawn_zrun(bad[i].env, args, "bad.log");
        int st = zt_wait_status(p);
        char *t = zt_slurp("bad.log");
        if (st != 2 || !strstr(t, bad[i].want))
            ZT_FAIL("%s zrun %s: status %d, wanted \"%s\":\n%s", bad[i].env, args, st,
                    bad[i].want, t);
        free(t);
    }
}

/* a zrun without libzr_mpi.so next to it, under mpirun: every rank says what is missing */
ZT_TEST(mpi_without_its_backend_says_what_is_missing)
{
    need_mpirun();
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "mkdir -p bin && cp %s bin/zrun", zt_zrun_path());
    ZT_CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, ZT_MPI_ENV "timeout 60 " MPIRUN "-np 2 bin/zrun " COMMON
             "--steps 2 --ckpt-dir n > noso.log 2>&1");
    int st = system(cmd);
    char *t = zt_slurp("noso.log");
    if (st == 0 || !strstr(t, "mpi: no MPI backend ") || !strstr(t, "bin/libzr_mpi.so"))
        ZT_FAIL("zrun without libzr_mpi.so under mpirun: status %d:\n%s", st, t);
    free(t);
}

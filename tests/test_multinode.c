/*
 * test_multinode.c: jobs across nodes, with every node played by a zrun launcher on this
 * machine (the ranks connect over TCP through the master address, as on real nodes): two
 * nodes of two ranks give exactly the checkpoint of one node of four ranks (the tcp backend's
 * sums have the shm backend's bits); ranks started by mpirun or srun (their environment, a
 * MASTER_ADDR:MASTER_PORT rendezvous) too; a rank killed on one node stops the job on the
 * other within seconds, naming what was lost, with `latest` still sound; the options' errors.
 */
#include "ckutil.h"
#include "zr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SMALL "gpt2:layers=2,heads=2,dim=32,ctx=32,vocab=256"
#define COMMON "--model " SMALL " --seq 32 --batch 8 --micro-batch 2 --threads 1 "


ZT_TEST(multinode_two_nodes_match_one)
{
    zt_zrun_ok(COMMON "--steps 8 --zero 2 --nproc 4 --ckpt-dir one", "one.log");
    char args[1024], master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", zt_free_port());
    pid_t p[2];
    for (int k = 1; k >= 0; k--) { /* node 1 first: it waits for node 0's rank 0 */
        snprintf(args, sizeof args, COMMON "--steps 8 --zero 2 --nproc 2 --nnodes 2 "
                 "--node-rank %d --master %s --ckpt-dir two", k, master);
        char log[32];
        snprintf(log, sizeof log, "node%d.log", k);
        p[k] = zt_spawn_zrun("", args, log);
    }
    for (int k = 0; k < 2; k++)
        if (zt_wait_status(p[k]) != 0)
            ZT_FAIL("node %d failed:\n%s", k, zt_slurp(k ? "node1.log" : "node0.log"));
    zt_same_latest("one", "two", 0, 0);
    zt_file_has("node0.log", "[rank 0] done at step 8/8");
}

ZT_TEST(multinode_under_mpirun_and_srun)
{
    zt_zrun_ok(COMMON "--steps 6 --zero 3 --nproc 2 --ckpt-dir ref", "ref.log");
    static const char *fmt[2] = {
        "OMPI_COMM_WORLD_RANK=%d OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=%d "
        "MASTER_ADDR=127.0.0.1 MASTER_PORT=%d ZR_COMM=",
        "SLURM_PROCID=%d SLURM_NTASKS=2 SLURM_LOCALID=%d MASTER_ADDR=localhost MASTER_PORT=%d"};
    for (int m = 0; m < 2; m++) {
        int port = zt_free_port();
        pid_t p[2];
        char env[256], dir[16], args[512], log[32];
        snprintf(dir, sizeof dir, "mpi%d", m);
        snprintf(args, sizeof args, COMMON "--steps 6 --zero 3 --ckpt-dir %s --comm tcp", dir);
        for (int r = 0; r < 2; r++) {
            snprintf(env, sizeof env, fmt[m], r, r, port);
            snprintf(log, sizeof log, "mpi%d-%d.log", m, r);
            p[r] = zt_spawn_zrun(env, args, log);
        }
        for (int r = 0; r < 2; r++) {
            snprintf(log, sizeof log, "mpi%d-%d.log", m, r);
            if (zt_wait_status(p[r]) != 0)
                ZT_FAIL("%s rank %d failed:\n%s", m ? "srun" : "mpirun", r, zt_slurp(log));
        }
        zt_same_latest("ref", dir, 0, 0);
    }
    /* no rendezvous address: refused, saying what to add */
    ZT_CHECK_EQ(zt_zrun(COMMON "--steps 2 --ckpt-dir x", "noaddr.log"), 0); /* not under MPI */
    zt_file_has("noaddr.log", "done at step 2/2");
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    unsetenv("MASTER_ADDR");
    ZT_CHECK_EQ(zt_zrun(COMMON "--steps 2 --ckpt-dir y --comm tcp", "nomaster.log"), 2);
    zt_file_has("nomaster.log", "without a rendezvous address");
    zt_file_has("nomaster.log", "MASTER_ADDR");
}

ZT_TEST(multinode_rank_killed_on_one_node_stops_the_other)
{
    char args[1024], master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", zt_free_port());
    pid_t p[2];
    for (int k = 1; k >= 0; k--) {
        snprintf(args, sizeof args, COMMON "--steps 100000 --save-every 5 --zero 1 --nproc 2 "
                 "--nnodes 2 --node-rank %d --master %s --ckpt-dir run --log-ranks all", k,
                 master);
        p[k] = zt_spawn_zrun("", args, k ? "node1.log" : "node0.log");
    }
    /* wait until training is under way and a checkpoint exists, then SIGKILL global rank 3 */
    zt_wait_file_has("node0.log", "saved run/step-00000010", 60);
    /* node 1's launcher runs sh -c exec zrun: its children are the two rank processes */
    pid_t kids[4];
    int nk = zt_children(p[1], kids, 4);
    if (nk != 2)
        ZT_SKIP("cannot find node 1's ranks (/proc/PID/task/PID/children: %d)", nk);
    ZT_CHECK(kill(kids[1], SIGKILL) == 0);
    double tk = zt_now_s();
    int s1 = zt_wait_status(p[1]), s0 = zt_wait_status(p[0]);
    double dt = zt_now_s() - tk;
    char *n0 = zt_slurp("node0.log"), *n1 = zt_slurp("node1.log");
    if (s1 == 0 || s0 == 0)
        ZT_FAIL("node exit statuses %d, %d:\n--- node 0\n%s\n--- node 1\n%s", s0, s1, n0, n1);
    if (!strstr(n1, "rank 3 was killed by signal 9"))
        ZT_FAIL("node 1 does not name rank 3:\n%s", n1);
    if (!strstr(n0, "rank 3 is gone") && !strstr(n0, "rank 2 is gone"))
        ZT_FAIL("node 0 does not say which rank was lost:\n%s", n0);
    if (dt > 20)
        ZT_FAIL("the job took %.1f s to stop", dt);
    free(n0);
    free(n1);
    /* what was committed is sound and resumes on one node */
    if (getenv("ZT_ZCKPT")) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s verify run > verify.log 2>&1", getenv("ZT_ZCKPT"));
        if (system(cmd) != 0)
            ZT_FAIL("zckpt verify run:\n%s", zt_slurp("verify.log"));
    }
    zt_zrun_ok(COMMON "--steps 100000 --stop-after 2 --zero 3 --nproc 2 --ckpt-dir run",
               "resume.log");
    zt_file_has("resume.log", "resumed from run/step-");
}

ZT_TEST(multinode_option_errors)
{
    static const struct {
        const char *args, *want;
    } bad[] = {
        {"--nnodes 2 --node-rank 0", "--nnodes 2 needs --master"},
        {"--nnodes 2 --node-rank 2 --master 127.0.0.1:1", "--node-rank 2: expected 0..1"},
        {"--nnodes 2 --node-rank 0 --master 127.0.0.1:1 --max-restarts 2",
         "work on one node only"},
        {"--nnodes 2 --node-rank 1 --master nonsense", "expected HOST:PORT"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char args[512];
        snprintf(args, sizeof args, COMMON "--steps 2 --ckpt-dir e %s", bad[i].args);
        int st = zt_zrun(args, "bad.log");
        char *t = zt_slurp("bad.log");
        if (st == 0 || !strstr(t, bad[i].want))
            ZT_FAIL("zrun %s: status %d, wanted \"%s\":\n%s", args, st, bad[i].want, t);
        free(t);
    }
}

/* the device path across nodes (hostsim: the device table run by the CPU engine): the NCCL
 * id travels over the TCP rendezvous, and the result has the CPU run's bits */
ZT_TEST(multinode_device_path_on_hostsim)
{
    zt_zrun_ok(COMMON "--steps 6 --zero 3 --nproc 2 --ckpt-dir ref", "ref.log");
    char args[1024], master[64];
    snprintf(master, sizeof master, "127.0.0.1:%d", zt_free_port());
    pid_t p[2];
    for (int k = 1; k >= 0; k--) {
        snprintf(args, sizeof args, COMMON "--steps 6 --zero 3 --nproc 1 --nnodes 2 "
                 "--node-rank %d --master %s --ckpt-dir dev --device cuda", k, master);
        p[k] = zt_spawn_zrun("ZR_CUDA_LIB=hostsim ZR_DEVICE_COMM=nccl", args,
                          k ? "dev1.log" : "dev0.log");
    }
    for (int k = 0; k < 2; k++)
        if (zt_wait_status(p[k]) != 0)
            ZT_FAIL("node %d failed:\n%s", k, zt_slurp(k ? "dev1.log" : "dev0.log"));
    char *t = zt_slurp("dev0.log");
    ZT_CHECK(strstr(t, "device: hostsim") && strstr(t, "; NCCL"));
    free(t);
    zt_same_latest("ref", "dev", 0, 0);
}

/*
 * env.c: every environment variable the project reads, in one table (zck.h, zr_env). Reading
 * goes through zr_env() so that a variable's name is written once, here, and docs/RUNNING.md's
 * table of variables is checked against this one by a test (tests/test_env.c).
 */
#include "zck_int.h"

#include <stdlib.h>

static const struct {
    const char *name, *doc;
} table[ZR_ENV_COUNT] = {
    [ZR_ENV_LOG] = {"ZR_LOG", "log level of the libraries: error, warn (default), info, debug"},
    [ZR_ENV_RANK] = {"ZR_RANK", "this process's global rank (set by the launcher)"},
    [ZR_ENV_WORLD] = {"ZR_WORLD", "the number of ranks of the job (set by the launcher)"},
    [ZR_ENV_LOCAL_RANK] = {"ZR_LOCAL_RANK",
                           "the rank's index on its node, which picks its GPU (set by the "
                           "launcher)"},
    [ZR_ENV_COMM_SHM] = {"ZR_COMM_SHM",
                         "the shared-memory segment of a one-node job (set by the launcher)"},
    [ZR_ENV_COMM_TCP] = {"ZR_COMM_TCP",
                         "HOST:PORT of global rank 0 for a job across nodes (set by the "
                         "launcher)"},
    [ZR_ENV_COMM_TCP_TIMEOUT] = {"ZR_COMM_TCP_TIMEOUT",
                                 "seconds the ranks of a multi-node job wait for each other "
                                 "(default 300)"},
    [ZR_ENV_DEVICE] = {"ZR_DEVICE", "zrun's default --device: cpu, cuda or auto"},
    [ZR_ENV_DEVICE_COMM] = {"ZR_DEVICE_COMM",
                            "nccl or shm: forces how GPU ranks exchange (default: nccl when "
                            "every rank has a GPU of its own)"},
    [ZR_ENV_CUDA_LIB] = {"ZR_CUDA_LIB",
                         "the device backend to load instead of libzr_cuda.so next to the "
                         "program; `hostsim` loads the host simulation (tests)"},
    [ZR_ENV_CUDA_VISIBLE_DEVICES] = {"CUDA_VISIBLE_DEVICES",
                                     "read (not set) to tell ranks on distinct GPUs apart when "
                                     "choosing NCCL"},
    [ZR_ENV_MASTER_ADDR] = {"MASTER_ADDR",
                            "the rendezvous host under mpirun or srun when --master is not "
                            "given"},
    [ZR_ENV_MASTER_PORT] = {"MASTER_PORT", "the rendezvous port, with MASTER_ADDR"},
    [ZR_ENV_OMPI_RANK] = {"OMPI_COMM_WORLD_RANK", "Open MPI's rank (mpirun)"},
    [ZR_ENV_OMPI_SIZE] = {"OMPI_COMM_WORLD_SIZE", "Open MPI's world size"},
    [ZR_ENV_OMPI_LOCAL_RANK] = {"OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI's local rank"},
    [ZR_ENV_PMI_RANK] = {"PMI_RANK", "MPICH/PMI's rank"},
    [ZR_ENV_PMI_SIZE] = {"PMI_SIZE", "MPICH/PMI's world size"},
    [ZR_ENV_PMI_LOCAL_RANK] = {"MPI_LOCALRANKID", "MPICH's local rank"},
    [ZR_ENV_SLURM_PROCID] = {"SLURM_PROCID", "Slurm's rank (srun)"},
    [ZR_ENV_SLURM_NTASKS] = {"SLURM_NTASKS", "Slurm's world size"},
    [ZR_ENV_SLURM_LOCALID] = {"SLURM_LOCALID", "Slurm's local rank"},
    [ZR_ENV_JOB_ID] = {"ZR_JOB_ID",
                       "a job's identity across nodes (same on every node): the TCP rendezvous "
                       "turns away ranks of another job"},
    [ZR_ENV_SLURM_JOB_ID] = {"SLURM_JOB_ID", "Slurm's job, the job's identity without ZR_JOB_ID"},
    [ZR_ENV_SLURM_STEP_ID] = {"SLURM_STEP_ID", "Slurm's job step, with SLURM_JOB_ID"},
    [ZR_ENV_PMIX_NAMESPACE] = {"PMIX_NAMESPACE",
                               "Open MPI's job (PMIx), the job's identity under mpirun"},
    [ZR_ENV_RUN_ID] = {"ZR_RUN_ID",
                       "the run id of the --log-json records and the checkpoints (set by zrun, "
                       "random per invocation)"},
    [ZR_ENV_COMM] = {"ZR_COMM",
                     "`mpi`: the ranks talk through MPI (set by zrun under mpirun or srun, "
                     "--comm)"},
    [ZR_ENV_COMM_MPI_WINDOW] = {"ZR_COMM_MPI_WINDOW",
                                "the most bytes one MPI message of a collective carries "
                                "(default 67108864; larger calls stream in windows)"},
    [ZR_ENV_PMIX_RANK] = {"PMIX_RANK",
                          "read (not set): a rank started by srun --mpi=pmix (or mpirun) can "
                          "initialize MPI"},
    [ZR_ENV_OMPI_LOCAL_SIZE] = {"OMPI_COMM_WORLD_LOCAL_SIZE",
                                "Open MPI's ranks on this node (read: more ranks than CPUs "
                                "makes MPI yield while it waits)"},
    [ZR_ENV_OMPI_YIELD] = {"OMPI_MCA_mpi_yield_when_idle",
                           "Open MPI's setting; set to 1 by the MPI communicator when a node "
                           "has more ranks than CPUs and it is not set already"},
    [ZR_ENV_SAVE_THROTTLE_MS] = {"ZR_SAVE_THROTTLE_MS",
                                 "tests and benchmarks: an asynchronous save's writer sleeps this "
                                 "many milliseconds per chunk it writes (a disk slower than a "
                                 "step)"},
};

const char *zr_env_name(zr_env_var v) { return v < ZR_ENV_COUNT ? table[v].name : NULL; }

const char *zr_env_doc(zr_env_var v) { return v < ZR_ENV_COUNT ? table[v].doc : NULL; }

const char *zr_env(zr_env_var v)
{
    const char *s = v < ZR_ENV_COUNT ? getenv(table[v].name) : NULL;
    return s && *s ? s : NULL;
}

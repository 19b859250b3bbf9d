/* mpi_check: the project's own MPI check and small benchmark (tests/engines_netns.rs,
 * docs/engines.md). Built with Open MPI's or MPICH's mpicc, unmodified by xroce.
 *
 *   mpi_check [-l LAT_ITERS] [-b BW_ITERS] [-w WINDOW] [-s BW_BYTES]
 *
 * Between ranks 0 and 1: an 8-byte ping-pong (half round trip, in microseconds), a 1 MiB
 * message 0 -> 1 and back checked byte for byte (a pattern of the sender's rank and the byte's
 * index), and a bandwidth run (WINDOW messages of BW_BYTES in flight, BW_ITERS times, each
 * window acknowledged). On every rank: a ring exchange (rank -> rank+1) checked, an
 * MPI_Allreduce of the ranks (checked against n(n-1)/2) and of a 64 Ki-element vector
 * (checked element by element), and an MPI_Barrier. Rank 0 prints one line:
 *
 *   mpi_check ok ranks=N lat8_us=X bw1m_MBps=Y
 *
 * and every rank prints `mpi_check rank=R host=H` first, so the placement can be seen. Any
 * mismatch prints `mpi_check FAILED: ...` and ends the job with MPI_Abort (exit status 2).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1024 * 1024)
#define VEC 65536

static int rank, nranks;

static void fail(const char *what, long index, unsigned got, unsigned want)
{
    fprintf(stderr, "mpi_check FAILED: rank %d: %s: at %ld got 0x%x, want 0x%x\n", rank, what,
            index, got, want);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

/* The byte at `i` of a message from rank `from` (round `round`): never constant, differs by
 * sender and by round, so a stale or misplaced buffer does not pass. */
static unsigned char pattern(int from, int round, size_t i)
{
    uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)(from + 1) * 40503u ^ (uint32_t)round * 97u;
    return (unsigned char)(x ^ (x >> 13) ^ (x >> 24));
}

static void fill(unsigned char *buf, size_t len, int from, int round)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = pattern(from, round, i);
}

static void verify(const unsigned char *buf, size_t len, int from, int round, const char *what)
{
    for (size_t i = 0; i < len; i++)
        if (buf[i] != pattern(from, round, i))
            fail(what, (long)i, buf[i], pattern(from, round, i));
}

static long arg(int argc, char **argv, const char *flag, long dflt)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], flag) == 0) {
            char *end;
            long v = strtol(argv[i + 1], &end, 10);
            if (*end || v <= 0) {
                fprintf(stderr, "mpi_check: %s wants a positive number, not %s\n", flag,
                        argv[i + 1]);
                exit(1);
            }
            return v;
        }
    return dflt;
}

int main(int argc, char **argv)
{
    long lat_iters = arg(argc, argv, "-l", 1000);
    long bw_iters = arg(argc, argv, "-b", 20);
    long window = arg(argc, argv, "-w", 4);
    long bw_bytes = arg(argc, argv, "-s", MIB);
    char host[256] = "?";

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    gethostname(host, sizeof host - 1);
    printf("mpi_check rank=%d host=%s pid=%d\n", rank, host, (int)getpid());
    fflush(stdout);
    if (nranks < 2) {
        if (rank == 0)
            fprintf(stderr, "mpi_check FAILED: needs at least 2 ranks, got %d\n", nranks);
        MPI_Finalize();
        return 1;
    }

    unsigned char *big = malloc(MIB);
    unsigned char *bw = malloc((size_t)bw_bytes * (size_t)window);
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * (size_t)window);
    if (!big || !bw || !reqs) {
        fprintf(stderr, "mpi_check FAILED: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    /* 8-byte ping-pong, checked each round; the first tenth is warm-up. */
    double lat_us = 0;
    if (rank <= 1) {
        int peer = 1 - rank;
        long warm = lat_iters / 10 + 1;
        uint64_t v = 0;
        double t0 = 0;
        for (long i = 0; i < warm + lat_iters; i++) {
            if (i == warm)
                t0 = MPI_Wtime();
            if (rank == 0) {
                v = (uint64_t)i * 0x9e3779b97f4a7c15ull;
                MPI_Send(&v, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                MPI_Recv(&v, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (v != ~((uint64_t)i * 0x9e3779b97f4a7c15ull))
                    fail("ping-pong answer", i, (unsigned)v, 0);
            } else {
                MPI_Recv(&v, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (v != (uint64_t)i * 0x9e3779b97f4a7c15ull)
                    fail("ping-pong request", i, (unsigned)v, 0);
                v = ~v;
                MPI_Send(&v, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            }
        }
        lat_us = (MPI_Wtime() - t0) * 1e6 / (2.0 * (double)lat_iters);
    }

    /* 1 MiB 0 -> 1, checked, and 1 -> 0 with rank 1's pattern, checked. */
    if (rank == 0) {
        fill(big, MIB, 0, 7);
        MPI_Send(big, MIB, MPI_BYTE, 1, 2, MPI_COMM_WORLD);
        memset(big, 0, MIB);
        MPI_Recv(big, MIB, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        verify(big, MIB, 1, 7, "1 MiB from rank 1");
    } else if (rank == 1) {
        memset(big, 0, MIB);
        MPI_Recv(big, MIB, MPI_BYTE, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        verify(big, MIB, 0, 7, "1 MiB from rank 0");
        fill(big, MIB, 1, 7);
        MPI_Send(big, MIB, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
    }

    /* Bandwidth 0 -> 1: WINDOW messages in flight, a 1-byte acknowledgement per window; the
     * last window's data is checked. */
    double mbps = 0;
    if (rank <= 1) {
        char ack = 0;
        for (long w = 0; w < window; w++)
            fill(bw + w * bw_bytes, (size_t)bw_bytes, rank == 0 ? 0 : 99, (int)w);
        double t0 = 0;
        for (long i = 0; i < bw_iters + 1; i++) {
            if (i == 1)
                t0 = MPI_Wtime(); /* the first window is warm-up */
            for (long w = 0; w < window; w++) {
                if (rank == 0)
                    MPI_Isend(bw + w * bw_bytes, (int)bw_bytes, MPI_BYTE, 1, 3, MPI_COMM_WORLD,
                              &reqs[w]);
                else
                    MPI_Irecv(bw + w * bw_bytes, (int)bw_bytes, MPI_BYTE, 0, 3, MPI_COMM_WORLD,
                              &reqs[w]);
            }
            MPI_Waitall((int)window, reqs, MPI_STATUSES_IGNORE);
            if (rank == 0)
                MPI_Recv(&ack, 1, MPI_BYTE, 1, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            else
                MPI_Send(&ack, 1, MPI_BYTE, 0, 4, MPI_COMM_WORLD);
        }
        double secs = MPI_Wtime() - t0;
        mbps = (double)bw_bytes * (double)window * (double)bw_iters / secs / 1e6;
        if (rank == 1)
            for (long w = 0; w < window; w++)
                verify(bw + w * bw_bytes, (size_t)bw_bytes, 0, (int)w, "bandwidth message");
    }

    /* Ring: 64 KiB from every rank to the next, checked. */
    {
        size_t len = 65536;
        int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
        unsigned char *out = malloc(len), *in = calloc(1, len);
        fill(out, len, rank, 11);
        MPI_Sendrecv(out, (int)len, MPI_BYTE, next, 5, in, (int)len, MPI_BYTE, prev, 5,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        verify(in, len, prev, 11, "ring message");
        free(out);
        free(in);
    }

    /* Allreduce of the ranks, and of a vector. */
    long mine = rank, sum = -1;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (sum != (long)nranks * (nranks - 1) / 2)
        fail("allreduce of the ranks", 0, (unsigned)sum, (unsigned)(nranks * (nranks - 1) / 2));
    int *vin = malloc(sizeof(int) * VEC), *vout = malloc(sizeof(int) * VEC);
    for (int i = 0; i < VEC; i++)
        vin[i] = i * (rank + 1);
    MPI_Allreduce(vin, vout, VEC, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < VEC; i++) {
        int want = i * (nranks * (nranks + 1) / 2);
        if (vout[i] != want)
            fail("allreduce of a vector", i, (unsigned)vout[i], (unsigned)want);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    if (rank == 0) {
        printf("mpi_check ok ranks=%d lat8_us=%.2f bw1m_MBps=%.1f\n", nranks, lat_us, mbps);
        fflush(stdout);
    }
    free(vin);
    free(vout);
    free(big);
    free(bw);
    free(reqs);
    MPI_Finalize();
    return 0;
}

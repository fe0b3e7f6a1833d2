/* tests/t_tp_rdv.c - the TCP rendezvous of a multi-process TP group (group cpu; docs/TP.md): rank 0
 * serves the NCCL id on tcp://HOST:PORT (qsa__tp_rdv_serve), ranks 1..tp-1 fetch it
 * (qsa__tp_rdv_fetch).  Every rank here is a thread on 127.0.0.1 with a port the kernel just handed
 * out; the ids are test bytes, no NCCL is involved.
 */
#include <arpa/inet.h>
#include <sys/resource.h>
#include <dirent.h>

/* Open file descriptors of this process (Linux /proc; -1 elsewhere): each test ends with as many as
   it started with, so every path closed its sockets. */
static int rdv_open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A port that was free a moment ago: bind 127.0.0.1:0, read the port, close. */
static int rdv_free_port(void) {
    struct sockaddr_in sa;
    socklen_t n = sizeof sa;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (struct sockaddr *)&sa, &n) == 0)
        port = ntohs(sa.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* A connected (blocking) client socket to 127.0.0.1:port, or -1. */
static int rdv_connect(int port) {
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    for (int i = 0; i < 200; i++) { /* until rank 0 listens */
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return fd;
        if (fd >= 0) close(fd);
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

/* One rank in a thread: rank 0 serves `id`, the others fetch into it. */
typedef struct rdv_rank {
    char spec[64];
    int tp, rank;
    double timeout_s;
    unsigned char id[128];
    qsa_result r;
    char err[1024];
    pthread_t th;
    int done;
} rdv_rank;

static void *rdv_rank_main(void *p) {
    rdv_rank *k = (rdv_rank *)p;
    k->r = k->rank == 0 ? qsa__tp_rdv_serve(k->spec, k->tp, k->id, k->timeout_s)
                        : qsa__tp_rdv_fetch(k->spec, k->tp, k->rank, k->id, k->timeout_s);
    snprintf(k->err, sizeof k->err, "%s", k->r == QSA_OK ? "" : qsa_last_error());
    __atomic_store_n(&k->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void rdv_start(rdv_rank *k, int port, int tp, int rank, double timeout_s) {
    memset(k, 0, sizeof *k);
    snprintf(k->spec, sizeof k->spec, "tcp://127.0.0.1:%d", port);
    k->tp = tp;
    k->rank = rank;
    k->timeout_s = timeout_s;
    for (int i = 0; rank == 0 && i < 128; i++) k->id[i] = (unsigned char)(i * 13 + 5);
    pthread_create(&k->th, NULL, rdv_rank_main, k);
}

static void rdv_join(rdv_rank *k) {
    pthread_join(k->th, NULL);
    if (k->r != QSA_OK) printf("    rank %d of %d: %s\n", k->rank, k->tp, k->err);
}

/* Bad addresses are refused before any socket is opened, with a message naming what is wrong. */
TEST(cpu, tp_rendezvous_tcp_bad_specs) {
    static const char *bad[][2] = {
        {"tcp://node0", "no port"},         {"tcp://node0:", "not a number in 1..65535"},
        {"tcp://node0:0", "'0' is not"},   {"tcp://node0:65536", "'65536' is not"},
        {"tcp://node0:29x", "'29x' is not"}, {"tcp://node0:-1", "'-1' is not"},
        {"tcp://:29500", "empty host"},     {"tcp://[]:29500", "empty host"},
        {"tcp://[::1:29500", "no ']'"},     {"tcp://[::1]", "no port"},
        {"tcp://[::1]29500", "no port"},    {"tcp://::1:29500", "in brackets"},
    };
    unsigned char id[128] = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_ERR(qsa__tp_rdv_fetch(bad[i][0], 2, 1, id, 1.0), QSA_ERR_INVALID_ARGUMENT, bad[i][1]);
        CHECK_ERR(qsa__tp_rdv_serve(bad[i][0], 2, id, 1.0), QSA_ERR_INVALID_ARGUMENT, bad[i][1]);
        CHECK(strstr(qsa_last_error(), bad[i][0]) != NULL); /* the message names the address */
    }
    CHECK_ERR(qsa__tp_rdv_fetch("tcp://*:29500", 2, 1, id, 1.0), QSA_ERR_INVALID_ARGUMENT, "names no host to connect to");
    qsa__tp_rdv_addr a;
    CHECK_OK(qsa__tp_rdv_parse("tcp://*:29500", 1, &a));
    CHECK(!strcmp(a.host, "0.0.0.0") && !strcmp(a.port, "29500"));
    CHECK_OK(qsa__tp_rdv_parse("tcp://[fe80::1%eth0]:1", 0, &a));
    CHECK(!strcmp(a.host, "fe80::1%eth0") && !strcmp(a.port, "1"));
    CHECK_OK(qsa__tp_rdv_parse("tcp://node-3.cluster:08080", 0, &a));
    CHECK(!strcmp(a.host, "node-3.cluster") && !strcmp(a.port, "8080"));
    CHECK(qsa__tp_rdv_is_tcp("tcp://h:1") && !qsa__tp_rdv_is_tcp("/shared/tcp://x") && !qsa__tp_rdv_is_tcp(NULL));
}

/* Rank 0 and three other ranks: every rank gets rank 0's 128 bytes, and rank 0 returns only after
   all three hold them. */
TEST(cpu, tp_rendezvous_tcp_exchange) {
    int fds = rdv_open_fds(), port = rdv_free_port();
    CHECK(port > 0);
    rdv_rank k[4];
    for (int r = 1; r < 4; r++) rdv_start(&k[r], port, 4, r, 10.0); /* early: they retry until rank 0 listens */
    rdv_start(&k[0], port, 4, 0, 10.0);
    for (int r = 0; r < 4; r++) rdv_join(&k[r]);
    for (int r = 0; r < 4; r++) CHECK(k[r].r == QSA_OK);
    for (int r = 1; r < 4; r++) CHECKF(!memcmp(k[r].id, k[0].id, 128), "rank %d", r);
    CHECK(rdv_open_fds() == fds);
}

/* Nobody serving: a fetch gives up at its timeout and says so; rank 0 gives up when a rank never
   comes and names it; a port in use and a foreign service answer with their own errors. */
TEST(cpu, tp_rendezvous_tcp_failures) {
    unsigned char id[128];
    char spec[64], msg[1024];
    int fds = rdv_open_fds(), port = rdv_free_port();
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%d", port);
    double t0 = qsa__now();
    CHECK_ERR(qsa__tp_rdv_fetch(spec, 2, 1, id, 0.2), QSA_ERR_IO, "rank 1 got no id from rank 0 within 0.2 s");
    double dt = qsa__now() - t0;
    CHECKF(dt >= 0.15 && dt < 1.0, "%.3f s", dt); /* the last attempt starts 20 ms before the deadline at the latest */
    CHECK(strstr(qsa_last_error(), spec) && strstr(qsa_last_error(), "Connection refused"));

    rdv_rank k0, k1;
    rdv_start(&k0, port, 3, 0, 0.3);
    rdv_start(&k1, port, 3, 1, 5.0);
    rdv_join(&k1);
    pthread_join(k0.th, NULL);
    CHECK(k1.r == QSA_OK && !memcmp(k1.id, k0.id, 128));
    CHECK(k0.r == QSA_ERR_IO && strstr(k0.err, "1 of 2 ranks took the id within 0.3 s") && strstr(k0.err, "missing ranks: 2"));

    /* the port is taken */
    int holder = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    socklen_t n = sizeof sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(holder, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(holder, 4) == 0 &&
          getsockname(holder, (struct sockaddr *)&sa, &n) == 0);
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%d", ntohs(sa.sin_port));
    CHECK_ERR(qsa__tp_rdv_serve(spec, 2, id, 1.0), QSA_ERR_IO, "cannot listen on 127.0.0.1:");
    CHECK(strstr(qsa_last_error(), "Address already in use") != NULL);

    /* something else listens there: it answers junk */
    rdv_rank k2;
    memset(&k2, 0, sizeof k2);
    snprintf(k2.spec, sizeof k2.spec, "%s", spec);
    k2.tp = 2;
    k2.rank = 1;
    k2.timeout_s = 5.0;
    pthread_create(&k2.th, NULL, rdv_rank_main, &k2);
    int c = accept(holder, NULL, NULL);
    memset(msg, 'x', sizeof msg);
    CHECK(c >= 0 && send(c, msg, 200, MSG_NOSIGNAL) == 200);
    pthread_join(k2.th, NULL);
    CHECK(k2.r == QSA_ERR_FORMAT && strstr(k2.err, "without the QSATPID1 header"));
    if (c >= 0) close(c);
    close(holder);

    /* ranks started with different tp: both sides fail, each naming both sizes */
    port = rdv_free_port();
    rdv_start(&k0, port, 4, 0, 5.0);
    rdv_start(&k1, port, 2, 1, 5.0);
    pthread_join(k0.th, NULL);
    pthread_join(k1.th, NULL);
    CHECKF(k0.r == QSA_ERR_INVALID_ARGUMENT && strstr(k0.err, "rank 1 (from 127.0.0.1:") && strstr(k0.err, "started with tp = 2, this group has tp = 4"),
           "%s", k0.err);
    CHECKF(k1.r == QSA_ERR_INVALID_ARGUMENT && strstr(k1.err, "leads a group of tp = 4, this rank (1) was started with tp = 2"), "%s", k1.err);
    CHECK(rdv_open_fds() == fds);
}

/* Rank 0's host resolves to two addresses and the first drops connection attempts silently (here a listener on
   127.0.0.2 whose accept queue is full): the rank moves on to the second within qsa__tp_rdv_connect_s and gets
   the id there (it spent its whole timeout on the first address). */
TEST(cpu, tp_rendezvous_tcp_moves_past_an_address_that_drops) {
    int fds = rdv_open_fds(), port = rdv_free_port();
    struct sockaddr_in hole, live;
    memset(&hole, 0, sizeof hole);
    hole.sin_family = AF_INET;
    hole.sin_addr.s_addr = htonl(0x7f000002u);
    hole.sin_port = htons((uint16_t)port);
    live = hole;
    live.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int lfd = socket(AF_INET, SOCK_STREAM, 0), filler[4];
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&hole, sizeof hole) != 0 || listen(lfd, 0) != 0) {
        if (lfd >= 0) close(lfd);
        SKIP("cannot listen on 127.0.0.2");
    }
    for (int i = 0; i < 4; i++) { /* fill the accept queue: later attempts get no answer */
        filler[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (filler[i] >= 0) (void)!connect(filler[i], (struct sockaddr *)&hole, sizeof hole);
    }
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    rdv_rank k0;
    rdv_start(&k0, port, 2, 0, 10.0);
    struct addrinfo a1, a0;
    memset(&a1, 0, sizeof a1);
    a1.ai_family = AF_INET;
    a1.ai_socktype = SOCK_STREAM;
    a1.ai_addr = (struct sockaddr *)&live;
    a1.ai_addrlen = sizeof live;
    a0 = a1;
    a0.ai_addr = (struct sockaddr *)&hole;
    a0.ai_next = &a1;
    double saved = qsa__tp_rdv_connect_s;
    qsa__tp_rdv_connect_s = 0.3;
    unsigned char id[128] = {0};
    char last[400] = "";
    qsa_result r = QSA_OK;
    double t0 = qsa__now();
    int st = 0;
    for (int round = 0; round < 40 && st == 0 && qsa__now() - t0 < 4.0; round++) { /* until rank 0 listens */
        st = qsa__tp_rdv_round("test", &a0, 2, 1, id, t0 + 4.0, last, sizeof last, &r);
        if (!st) nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    double dt = qsa__now() - t0;
    qsa__tp_rdv_connect_s = saved;
    CHECKF(st == 1 && r == QSA_OK && dt < 2.0, "round %d after %.2f s (last: %s)", st, dt, last);
    rdv_join(&k0);
    CHECK(k0.r == QSA_OK && !memcmp(id, k0.id, 128));
    for (int i = 0; i < 4; i++)
        if (filler[i] >= 0) close(filler[i]);
    close(lfd);
    CHECK(rdv_open_fds() == fds);
}

/* Clients that close at once, send junk, stall half-way or leave before acknowledging, and a rank
   that fetches twice: rank 0 counts only whole exchanges, each rank once, and every real rank gets
   the id. */
TEST(cpu, tp_rendezvous_tcp_survives_bad_clients) {
    int fds = rdv_open_fds(), port = rdv_free_port();
    rdv_rank k0, k1, k1again, k2;
    rdv_start(&k0, port, 3, 0, 10.0);
    int gone = rdv_connect(port), junk = rdv_connect(port), stall = rdv_connect(port), quitter = rdv_connect(port);
    CHECK(gone >= 0 && junk >= 0 && stall >= 0 && quitter >= 0);
    if (gone >= 0) close(gone);
    unsigned char hello[16], reply[140];
    memset(hello, 0xA5, sizeof hello);
    if (junk >= 0) CHECK(send(junk, hello, sizeof hello, MSG_NOSIGNAL) == 16);
    if (stall >= 0) CHECK(send(stall, "QSATP", 5, MSG_NOSIGNAL) == 5);
    /* a well-formed rank 2 that reads the id and leaves without acknowledging: not counted */
    memcpy(hello, "QSATPID1", 8);
    qsa__be32_put(hello + 8, 3);
    qsa__be32_put(hello + 12, 2);
    if (quitter >= 0) {
        CHECK(send(quitter, hello, sizeof hello, MSG_NOSIGNAL) == 16);
        size_t got = 0;
        for (ssize_t r; got < sizeof reply && (r = recv(quitter, reply + got, sizeof reply - got, 0)) > 0;) got += (size_t)r;
        CHECK(got == sizeof reply && !memcmp(reply + 12, k0.id, 128));
        close(quitter);
    }
    rdv_start(&k1, port, 3, 1, 10.0);
    rdv_join(&k1);
    rdv_start(&k1again, port, 3, 1, 10.0);
    rdv_join(&k1again);
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    CHECK(!__atomic_load_n(&k0.done, __ATOMIC_ACQUIRE)); /* rank 2 has not acknowledged yet */
    rdv_start(&k2, port, 3, 2, 10.0);
    rdv_join(&k2);
    rdv_join(&k0);
    CHECK(k0.r == QSA_OK && k1.r == QSA_OK && k1again.r == QSA_OK && k2.r == QSA_OK);
    CHECK(!memcmp(k1.id, k0.id, 128) && !memcmp(k1again.id, k0.id, 128) && !memcmp(k2.id, k0.id, 128));
    if (junk >= 0) close(junk);
    if (stall >= 0) close(stall);
    CHECK(rdv_open_fds() == fds);
}

/* Hellos that no rank can send (tp 0, or a rank outside 0..tp-1 of its own tp) are malformed: rank 0
   drops them and goes on, as for junk; they used to fail the group as "started with tp = 0". */
TEST(cpu, tp_rendezvous_tcp_drops_impossible_hellos) {
    int fds = rdv_open_fds(), port = rdv_free_port();
    rdv_rank k0, k1;
    rdv_start(&k0, port, 2, 0, 10.0);
    static const uint32_t bad[4][2] = {{0, 0}, {3, 7}, {1, 0}, {0xFFFFFFFFu, 5}};
    for (int i = 0; i < 4; i++) {
        int fd = rdv_connect(port);
        CHECK(fd >= 0);
        if (fd < 0) continue;
        unsigned char hello[16], reply[140];
        memcpy(hello, "QSATPID1", 8);
        qsa__be32_put(hello + 8, bad[i][0]);
        qsa__be32_put(hello + 12, bad[i][1]);
        CHECK(send(fd, hello, sizeof hello, MSG_NOSIGNAL) == 16);
        CHECKF(recv(fd, reply, sizeof reply, MSG_WAITALL) == 0, "hello tp %u rank %u got an answer", bad[i][0], bad[i][1]);
        close(fd);
    }
    CHECK(!__atomic_load_n(&k0.done, __ATOMIC_ACQUIRE));
    rdv_start(&k1, port, 2, 1, 10.0);
    rdv_join(&k1);
    rdv_join(&k0);
    CHECK(k0.r == QSA_OK && k1.r == QSA_OK && !memcmp(k1.id, k0.id, 128));
    CHECK(rdv_open_fds() == fds);
}

/* Rank 0 out of file descriptors (idle connections fill its limit): accept fails with EMFILE, and
   rank 0 pauses accepting instead of failing the group (it ended the rendezvous at once); once the
   idle clients close, it accepts again and serves rank 1.  Rank 0 runs in a child process with a low
   RLIMIT_NOFILE. */
TEST(cpu, tp_rendezvous_tcp_out_of_descriptors) {
    int port = rdv_free_port();
    char spec[64];
    snprintf(spec, sizeof spec, "tcp://127.0.0.1:%d", port);
    unsigned char id[128];
    for (int i = 0; i < 128; i++) id[i] = (unsigned char)(i * 13 + 5);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl;
        int lim = 0;
        for (int free_below = 0; free_below < 4; lim++) /* 4 free numbers: the listening socket and 3 connections */
            free_below += fcntl(lim, F_GETFD) == -1 && errno == EBADF;
        if (getrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(3);
        rl.rlim_cur = (rlim_t)lim;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(3);
        _exit(qsa__tp_rdv_serve(spec, 2, id, 20.0) == QSA_OK ? 0 : 1);
    }
    int idle[4];
    for (int i = 0; i < 4; i++) idle[i] = rdv_connect(port);
    rdv_rank k1;
    rdv_start(&k1, port, 2, 1, 20.0);
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    for (int i = 0; i < 4; i++)
        if (idle[i] >= 0) close(idle[i]);
    rdv_join(&k1);
    int st = -1;
    waitpid(pid, &st, 0);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 0 exited with %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    CHECK(k1.r == QSA_OK && !memcmp(k1.id, id, 128));
}

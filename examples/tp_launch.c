/* tp_launch.c - tensor-parallel generation over several processes (one GPU and one rank each), on qsa_runtime.
 *
 *   examples/tp_launch -n 2 [--rendezvous tcp://HOST:PORT] [-m DIR] [-p TEXT] [-t TOKENS]
 *                                                                   launcher: starts one process per GPU here
 *   examples/tp_launch --rank R --world N --rendezvous FILE|tcp://HOST:PORT [--device D] [-m DIR] [-p TEXT] [-t TOKENS]
 *                                                                   one rank (start one per GPU, on any host)
 *   examples/tp_launch --one-process -n 2 [-m DIR] [-p TEXT]        for comparison: one process, N GPUs
 *
 * Every rank loads the model with qsa_model_params.tp = N, tp_rank = R and tp_rendezvous = FILE: rank 0
 * writes the NCCL unique id to FILE, the others wait for it, then all join one communicator
 * (ncclCommInitRank).  With tcp://HOST:PORT instead, rank 0 listens there and hands the id to each
 * rank that connects.  The ranks run the same program on the same prompt (SPMD, like torchrun): each
 * holds its share of the weights, the ranks exchange partial sums after every row-parallel block, and
 * every rank gets the same logits, bit for bit, so the same greedy tokens.  Each rank prints its text,
 * a hash of its tokens (equal on all ranks) and the communication the runtime counted.
 *
 * Several hosts: start `tp_launch --rank R --world N --rendezvous SPEC --device D` on each host, SPEC
 * either a FILE on a file system every host sees (NFS), new for each launch, or tcp://HOST:PORT with
 * HOST rank 0's host (rank 0 may give "*" as HOST to listen on every interface).  NCCL picks the
 * network for the collectives (NCCL_SOCKET_IFNAME etc. as usual).
 */
#define QSA_RUNTIME_IMPLEMENTATION
#include "../qsa_runtime.h"
#include "cli.h"

#include <signal.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static void usage(FILE *f, const char *argv0) {
    fprintf(f,
            "usage: %s [options]\n"
            "  -n, --nproc N          launcher: start N ranks, one process per GPU 0..N-1 (default 2)\n"
            "      --one-process      one process drives the N GPUs (ncclCommInitAll) instead\n"
            "      --rank R           run one rank (with --world and --rendezvous)\n"
            "      --world N          ranks in the group\n"
            "      --rendezvous SPEC  how the ranks meet: an id FILE every rank sees (new for each launch), or\n"
            "                         tcp://HOST:PORT (rank 0 listens there, the others connect; tcp://*:PORT:\n"
            "                         rank 0 on every interface).  Launcher: tcp:// only (default: a fresh file)\n"
            "      --device D         this rank's GPU (default: R)\n"
            "  -m, --model DIR        model directory (default models/tiny)\n"
            "  -p, --prompt TEXT      prompt (chat template applied; default \"Tell me a story\")\n"
            "  -t, --tokens N         tokens to generate (default 32)\n"
            "  -v, --verbose          log to stderr\n",
            argv0);
}

typedef struct opts {
    int nproc, one_process, rank, world, device, tokens, verbose;
    const char *rdv, *model, *prompt;
} opts;

/* One model (tp ranks in this process or one rank of a group): generate greedily and report. */
static int run_rank(const opts *o) {
    qsa_model_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = QSA_BACKEND_CUDA;
    mp.tp = o->world;
    if (o->rdv) {
        mp.tp_rendezvous = o->rdv;
        mp.tp_rank = o->rank;
        mp.device = o->device;
    }
    qsa_model *m = NULL;
    if (qsa_model_load(o->model, &mp, &m) != QSA_OK) {
        fprintf(stderr, "rank %d: %s\n", o->rank, qsa_last_error());
        return 1;
    }
    const qsa_tokenizer *tok = qsa_model_get_tokenizer(m);
    if (!tok) { fprintf(stderr, "rank %d: %s has no tokenizer\n", o->rank, o->model); qsa_model_free(m); return 1; }
    qsa_chat_message msg = {"user", o->prompt};
    char *text = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    qsa_seq *s = NULL;
    qsa_generation g;
    memset(&g, 0, sizeof g);
    qsa_generate_params gp;
    memset(&gp, 0, sizeof gp); /* greedy: every rank picks the same tokens from the same logits */
    gp.max_tokens = o->tokens;
    int rc = 1;
    if (qsa_chat_apply_template(tok, &msg, 1, 1, &text) == QSA_OK && qsa_tokenize(tok, text, strlen(text), 1, &ids, &n) == QSA_OK &&
        qsa_seq_create(m, NULL, &s) == QSA_OK && qsa_generate(s, ids, (int)n, &gp, &g) == QSA_OK) {
        uint64_t h = 1469598103934665603ull;
        for (int i = 0; i < g.n_tokens; i++) h = (h ^ (uint32_t)g.tokens[i]) * 1099511628211ull;
        qsa_tp_info info;
        qsa_model_tp_info(m, &info);
        printf("rank %d of %d (ranks %d..%d in this process): %d tokens, hash %016llx, prefill %.1f ms, decode %.1f tok/s; "
               "%lld collectives, %lld bytes sent per rank\n  %s\n",
               info.first_rank, info.tp, info.first_rank, info.first_rank + info.n_local - 1, g.n_tokens, (unsigned long long)h,
               g.stats.prefill_s * 1e3, g.stats.decode_tok_s, info.collectives, info.bytes_sent, g.text);
        fflush(stdout);
        rc = 0;
    } else {
        fprintf(stderr, "rank %d: %s\n", o->rank, qsa_last_error());
    }
    qsa_generation_free(&g);
    qsa_seq_free(s);
    qsa_free(ids);
    qsa_free(text);
    qsa_model_free(m);
    return rc;
}

/* The launcher's ranks, for its signal handler: pids[0..n) (0 once waited for) */
static pid_t *g_pids;
static volatile int g_n;
static volatile sig_atomic_t g_signal;

static void stop_ranks(int sig) {
    for (int r = 0; r < g_n; r++)
        if (g_pids[r] > 0) kill(g_pids[r], sig);
}

static void on_signal(int sig) {
    g_signal = sig;
    stop_ranks(sig);
}

int main(int argc, char **argv) {
    opts o;
    memset(&o, 0, sizeof o);
    o.nproc = 2;
    o.rank = -1;
    o.device = -1;
    o.tokens = 32;
    o.model = "models/tiny";
    o.prompt = "Tell me a story";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (is_opt(a, "--one-process", NULL)) { o.one_process = 1; continue; }
        if (is_opt(a, "-v", "--verbose")) { o.verbose = 1; continue; }
        if (is_opt(a, "-h", "--help")) { usage(stdout, argv[0]); return 0; }
        int known = is_opt(a, "-n", "--nproc") || is_opt(a, "--rank", NULL) || is_opt(a, "--world", NULL) ||
                    is_opt(a, "--rendezvous", NULL) || is_opt(a, "--device", NULL) || is_opt(a, "-m", "--model") ||
                    is_opt(a, "-p", "--prompt") || is_opt(a, "-t", "--tokens");
        if (!known) { fprintf(stderr, "tp_launch: unknown option '%s'\n", a); usage(stderr, argv[0]); return 2; }
        need_value(a, v);
        i++;
        if (is_opt(a, "-n", "--nproc")) o.nproc = (int)cli_int(a, v, 1, 1024);
        else if (is_opt(a, "--rank", NULL)) o.rank = (int)cli_int(a, v, 0, 1023);
        else if (is_opt(a, "--world", NULL)) o.world = (int)cli_int(a, v, 1, 1024);
        else if (is_opt(a, "--rendezvous", NULL)) o.rdv = v;
        else if (is_opt(a, "--device", NULL)) o.device = (int)cli_int(a, v, 0, 1023);
        else if (is_opt(a, "-m", "--model")) o.model = v;
        else if (is_opt(a, "-p", "--prompt")) o.prompt = v;
        else o.tokens = (int)cli_int(a, v, 0, 1 << 30);
    }
    if (o.verbose) qsa_set_logger(qsa_log_stderr, NULL, QSA_LOG_INFO);
    if (o.rank >= 0) { /* one rank of a group */
        if (o.world < 1 || !o.rdv || o.rank >= o.world) { usage(stderr, argv[0]); return 2; }
        if (o.device < 0) o.device = o.rank;
        return run_rank(&o);
    }
    if (o.nproc < 1) { usage(stderr, argv[0]); return 2; }
    o.world = o.nproc;
    if (o.one_process) { o.rank = 0; return run_rank(&o); }
    /* the launcher: the tcp:// address given, else a fresh rendezvous path; one process per GPU, wait for all */
    if (o.rdv && strncmp(o.rdv, "tcp://", 6)) {
        fprintf(stderr, "tp_launch: the launcher makes its own rendezvous file; --rendezvous takes tcp://HOST:PORT here\n");
        return 2;
    }
    char dir[] = "/tmp/qsa_tp_launch_XXXXXX", path[64], rs[16], ws[16];
    if (!o.rdv && !mkdtemp(dir)) { perror("mkdtemp"); return 1; }
    snprintf(path, sizeof path, "%s/nccl_id", dir);
    const char *rdv = o.rdv ? o.rdv : path;
    snprintf(ws, sizeof ws, "%d", o.nproc);
    pid_t *pids = (pid_t *)calloc((size_t)o.nproc, sizeof(pid_t));
    if (!pids) { fprintf(stderr, "tp_launch: out of memory\n"); return 1; }
    g_pids = pids;
    g_n = 0;
    struct sigaction sa; /* a signal to the launcher goes to every rank, then the launcher cleans up and dies of it */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    static const int sigs[3] = {SIGINT, SIGTERM, SIGHUP};
    sigset_t held, mask; /* the signals wait while a rank is forked, until its pid is in g_pids */
    sigemptyset(&held);
    for (int k = 0; k < 3; k++) {
        sigaction(sigs[k], &sa, NULL);
        sigaddset(&held, sigs[k]);
    }
    int failed = 0, stopped = 0, unstarted = 0, stopping = 0; /* stopped: ended by the launcher's SIGTERM */
    for (int r = 0; r < o.nproc && !g_signal; r++) {
        snprintf(rs, sizeof rs, "%d", r);
        sigprocmask(SIG_BLOCK, &held, &mask);
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("tp_launch: fork");
            sigprocmask(SIG_SETMASK, &mask, NULL);
            unstarted = o.nproc - r;
            break;
        }
        if (pids[r] == 0) {
            /* the launcher's handler would take a signal sent before the exec and drop it (the rank then ran
               on): the rank dies of one held since the fork, or of one sent before it execs */
            for (int k = 0; k < 3; k++) signal(sigs[k], SIG_DFL);
            sigprocmask(SIG_SETMASK, &mask, NULL);
            char *args[20];
            int k = 0;
            args[k++] = argv[0];
            args[k++] = (char *)"--rank"; args[k++] = rs;
            args[k++] = (char *)"--world"; args[k++] = ws;
            args[k++] = (char *)"--rendezvous"; args[k++] = (char *)rdv;
            args[k++] = (char *)"-m"; args[k++] = (char *)o.model;
            args[k++] = (char *)"-p"; args[k++] = (char *)o.prompt;
            char ts[16];
            snprintf(ts, sizeof ts, "%d", o.tokens);
            args[k++] = (char *)"-t"; args[k++] = ts;
            if (o.verbose) args[k++] = (char *)"-v";
            args[k] = NULL;
            execv("/proc/self/exe", args);
            perror("execv");
            _exit(127);
        }
        g_n = r + 1;
        sigprocmask(SIG_SETMASK, &mask, NULL);
    }
    /* a rank that fails (or a fork that did) leaves the others waiting for it in the rendezvous or a
       collective: they are stopped */
    if (unstarted || g_signal) {
        stop_ranks(g_signal ? (int)g_signal : SIGTERM);
        stopping = 1;
    }
    for (int left = g_n; left > 0;) {
        int st = 0;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0) {
            if (errno == EINTR) continue;
            break;
        }
        int r = 0;
        while (r < g_n && pids[r] != p) r++;
        if (r == g_n) continue;
        pids[r] = 0;
        left--;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) continue;
        if (stopping && WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) {
            stopped++;
            continue;
        }
        failed++;
        if (!stopping && !g_signal && left) {
            fprintf(stderr, "tp_launch: rank %d failed; stopping the others\n", r);
            stop_ranks(SIGTERM);
            stopping = 1;
        }
    }
    if (!o.rdv) {
        remove(path);
        rmdir(dir);
    }
    free(pids);
    if (g_signal) { /* die of the signal, as the shell expects */
        signal((int)g_signal, SIG_DFL);
        raise((int)g_signal);
    }
    if (unstarted) fprintf(stderr, "tp_launch: %d of %d ranks could not be started\n", unstarted, o.nproc);
    if (failed || unstarted)
        fprintf(stderr, "tp_launch: %d of %d ranks failed, %d stopped by the launcher\n", failed, o.nproc, stopped);
    return failed || unstarted ? 1 : 0;
}

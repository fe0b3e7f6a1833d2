#include <dirent.h>
#include <fcntl.h>
#include <signal.h>

/* t_cli.c - the example programs run as users run them: chat's flags, a conversation fed on stdin, long
 * lines and long contexts; batch's request fields.  Group cpu; skipped where the examples are not built
 * (make test builds them). */

/* Runs `examples/PROG --backend cpu ARGS` (ARGS a shell fragment) with stdin from in[0..n).  Returns the
   exit status (-1 when it did not exit), its stdout and stderr in *out / *err (free them). */
static int cli_run(const char *prog, const char *args, const char *in, size_t n, char **out, char **err) {
    char dir[] = "/tmp/qsa_cli_XXXXXX", cmd[8192], pin[64], pout[64], perr[64];
    *out = *err = NULL;
    if (!mkdtemp(dir)) return -1;
    snprintf(pin, sizeof pin, "%s/in", dir);
    snprintf(pout, sizeof pout, "%s/out", dir);
    snprintf(perr, sizeof perr, "%s/err", dir);
    FILE *f = fopen(pin, "wb");
    if (f) {
        if (n) fwrite(in, 1, n, f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "cd '%s' && examples/%s --backend cpu %s < %s > %s 2> %s", test_path(""), prog, args, pin, pout, perr);
    int st = system(cmd);
    size_t len = 0;
    if (qsa__read_file(pout, out, &len) != QSA_OK) *out = NULL;
    if (qsa__read_file(perr, err, &len) != QSA_OK) *err = NULL;
    remove(pin);
    remove(pout);
    remove(perr);
    rmdir(dir);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
static int cli_chat(const char *args, const char *in, size_t n, char **out, char **err) {
    return cli_run("chat", args, in, n, out, err);
}

/* how many times s occurs in t */
static int cli_count(const char *t, const char *s) {
    int c = 0;
    for (const char *p = t ? strstr(t, s) : NULL; p; p = strstr(p + 1, s)) c++;
    return c;
}

#define CLI_SKIP_UNBUILT()                                                                                           \
    do {                                                                                                             \
        if (!qsa__file_exists(test_path("examples/chat"))) SKIP("examples/chat is not built (make examples/chat)"); \
    } while (0)

/* Flags with values that are not numbers of their range are usage errors (status 2) naming the flag
   (atoi read "abc" as 0: "-n abc" generated until the context was full). */
TEST(cpu, chat_cli_refuses_bad_flag_values) {
    CLI_SKIP_UNBUILT();
    static const struct { const char *args, *msg; } cases[] = {
        {"-n abc -p hi", "-n: 'abc' is not a whole number"},
        {"-n 0 -p hi", "-n 0 would answer nothing"},
        {"-n -5 -p hi", "-n: '-5' is not a whole number from -1"},
        {"-n 99999999999 -p hi", "-n: '99999999999'"},
        {"-c 0 -p hi", "-c: '0' is not a whole number from 1"},
        {"-c 12x -p hi", "-c: '12x'"},
        {"--temp nan -p hi", "--temp: 'nan' is not a finite number"},
        {"--top-p 1e99 -p hi", "--top-p: '1e99'"},
        {"--top-k -1 -p hi", "--top-k: '-1'"},
        {"-s -1 -p hi", "-s: '-1'"},
        {"-t many -p hi", "-t: 'many'"},
        {"-n", "-n needs a value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out, *err;
        int rc = cli_chat(cases[i].args, "", 0, &out, &err);
        CHECKF(rc == 2 && err && strstr(err, cases[i].msg), "'%s': status %d, stderr '%.200s'", cases[i].args, rc,
               err ? err : "");
        qsa_free(out);
        qsa_free(err);
    }
}

/* A turn that fails leaves the conversation going, on the first turn too (the tree before exited there:
   "hello" was never answered); a line holding a NUL byte is refused, not cut at it; -f of what cannot be
   read is an error, not an empty prompt.  The exit status says that a turn failed. */
TEST(cpu, chat_cli_failed_turns_do_not_end_the_chat) {
    CLI_SKIP_UNBUILT();
    char *out, *err;
    static const char bad[] = "\xff bad\nhello\n";
    int rc = cli_chat("-n 3 --temp 0", bad, sizeof bad - 1, &out, &err);
    CHECKF(rc == 1 && cli_count(err, "invalid UTF-8 at byte offset 0 ") == 1 && cli_count(err, "[prefill") == 1,
           "status %d, stderr '%.300s'", rc, err ? err : "");
    qsa_free(out);
    qsa_free(err);
    static const char nul[] = "abc\0def\nhi\n";
    rc = cli_chat("-n 3 --temp 0", nul, sizeof nul - 1, &out, &err);
    CHECKF(rc == 1 && cli_count(err, "NUL byte") == 1 && cli_count(err, "[prefill") == 1, "status %d, stderr '%.300s'", rc,
           err ? err : "");
    qsa_free(out);
    qsa_free(err);
    rc = cli_chat("-f /tmp -n 3", "", 0, &out, &err);
    CHECKF(rc == 1 && err && strstr(err, "cannot read '/tmp'"), "status %d, stderr '%.300s'", rc, err ? err : "");
    qsa_free(out);
    qsa_free(err);
    /* a conversation that outgrows -c: the answer that fills it says so, the next turn is refused with
       the way out, and /reset starts over */
    static const char conv[] = "hello there\nand again\n/reset\nhi\n";
    rc = cli_chat("-c 40 -n -1 --temp 0 --no-stats", conv, sizeof conv - 1, &out, &err);
    CHECKF(rc == 1 && cli_count(err, "filled the context of 40 tokens") == 2 && cli_count(err, "leaves no room") == 1 &&
               cli_count(err, "history cleared") == 1,
           "status %d, stderr '%.600s'", rc, err ? err : "");
    qsa_free(out);
    qsa_free(err);
}

/* A message longer than 64 KB is one turn (fgets into 64 KB split it into two, answered apart), and
   a context past 32,768 tokens gets a KV pool that holds it (the library's default pool is at most
   32,768 tokens: "-c 40000 -n -1" was refused).  The built-in tiny model with a 262,144-token config. */
TEST(cpu, chat_cli_long_lines_and_contexts) {
    CLI_SKIP_UNBUILT();
    if (!qsa__file_exists(test_path("tools/make_tiny_model"))) SKIP("tools/make_tiny_model is not built");
    char dir[] = "/tmp/qsa_cli_model_XXXXXX", cmd[4200];
    if (!mkdtemp(dir)) { CHECK(0); return; }
    snprintf(cmd, sizeof cmd, "'%s' '%s' --max-position-embeddings 262144 > /dev/null", test_path("tools/make_tiny_model"), dir);
    CHECK(system(cmd) == 0);
    size_t n = 0;
    char *line = (char *)malloc(70010);
    if (!line) { CHECK(0); return; }
    while (n + 7 < 70000) { memcpy(line + n, " return", 7); n += 7; }
    line[n++] = '\n';
    char args[4200], *out, *err;
    snprintf(args, sizeof args, "-m '%s' -c 30000 -n 2 --temp 0", dir);
    int rc = cli_chat(args, line, n, &out, &err);
    int tokens = 0;
    const char *p = err ? strstr(err, "[prefill ") : NULL;
    if (p) tokens = atoi(p + 9);
    CHECKF(rc == 0 && cli_count(err, "[prefill") == 1 && tokens >= 9000, "status %d, %d answers, first prefill %d tokens",
           rc, cli_count(err, "[prefill"), tokens);
    qsa_free(out);
    qsa_free(err);
    free(line);
    snprintf(args, sizeof args, "-m '%s' -c 40000 -n -1 --temp 0 -p hi", dir);
    rc = cli_chat(args, "", 0, &out, &err);
    CHECKF(rc == 0 && cli_count(err, "[prefill") == 1, "status %d, stderr '%.300s'", rc, err ? err : "");
    qsa_free(out);
    qsa_free(err);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* batch: a request's whole-number fields out of range or with a fraction are that request's error (the
   tree before cast 1e12 to int: undefined, the error then named -2147483648), the other requests run. */
TEST(cpu, batch_cli_refuses_bad_numbers) {
    if (!qsa__file_exists(test_path("examples/batch"))) SKIP("examples/batch is not built (make examples/batch)");
    char path[] = "/tmp/qsa_cli_batch_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { CHECK(0); return; }
    static const char lines[] = "{\"prompt\": \"hi\", \"max_tokens\": 1e12}\n{\"prompt\": \"hi\", \"top_k\": 2.5}\n"
                                "{\"prompt\": \"hi\", \"max_tokens\": 3}\n"
                                "{\"prompt\": \"hi\", \"max_tokens\": 2, \"seed\": 18446744073709551615}\n"
                                "{\"prompt\": \"hi\", \"seed\": -1}\n{\"prompt\": \"hi\", \"seed\": 18446744073709551616}\n";
    CHECK(write(fd, lines, sizeof lines - 1) == (ssize_t)(sizeof lines - 1));
    close(fd);
    char args[256], *out, *err;
    snprintf(args, sizeof args, "--temp 0 %s", path);
    int rc = cli_run("batch", args, "", 0, &out, &err);
    CHECKF(rc == 3 && cli_count(out, "max_tokens\\\": expected a whole number from 0 to 2147483647") == 1 &&
               cli_count(out, "top_k\\\": expected a whole number") == 1 && cli_count(out, "\"tokens\": 3") == 1 &&
               cli_count(out, "\"tokens\": 2") == 1 &&
               cli_count(out, "seed\\\": expected an integer from 0 to 18446744073709551615") == 2,
           "status %d, stdout '%.400s'", rc, out ? out : "");
    qsa_free(out);
    qsa_free(err);
    snprintf(args, sizeof args, "-n abc %s", path);
    rc = cli_run("batch", args, "", 0, &out, &err);
    CHECKF(rc == 2 && err && strstr(err, "-n: 'abc'"), "status %d, stderr '%.200s'", rc, err ? err : "");
    qsa_free(out);
    qsa_free(err);
    remove(path);
}

/* Every output line of batch is valid JSON, which is UTF-8: an error message naming a file whose path is
   not UTF-8 (or a long one cut inside a character by a message buffer) wrote those bytes as they were; and a
   string with \u0000 is refused, not cut there (a prompt "a\u0000b" was answered as "a", a stop string
   "\u0000" was dropped). */
TEST(cpu, batch_cli_json_output_is_utf8_and_nul_is_refused) {
    if (!qsa__file_exists(test_path("examples/batch"))) SKIP("examples/batch is not built (make examples/batch)");
    char dir[] = "/tmp/qsa_cli_json_XXXXXX", path[128], args[256], *out = NULL, *err = NULL;
    if (!mkdtemp(dir)) { CHECK(0); return; }
    snprintf(path, sizeof path, "%s/in\xff.jsonl", dir);
    FILE *f = fopen(path, "wb");
    if (!f) { CHECK(0); rmdir(dir); return; }
    fputs("{\"prompt\": 5}\n{\"prompt\": \"a\\u0000b\"}\n{\"prompt\": \"hi\", \"stop\": [\"\\u0000\"]}\n"
          "{\"messages\": [{\"role\": \"user\", \"content\": \"x\\u0000\"}]}\n{\"prompt\": \"hi\", \"max_tokens\": 2}\n", f);
    fclose(f);
    snprintf(args, sizeof args, "--temp 0 '%s'", path);
    int rc = cli_run("batch", args, "", 0, &out, &err);
    size_t n = out ? strlen(out) : 0;
    CHECKF(rc == 3 && out && qsa__u8_validate(out, n, "batch output") == QSA_OK && cli_count(out, "\\ufffd.jsonl:1:") == 1,
           "status %d, stdout '%.300s'", rc, out ? out : "");
    CHECKF(cli_count(out, "a NUL character") == 3 && cli_count(out, "\"tokens\": 2") == 1, "stdout '%.600s'", out ? out : "");
    qsa_free(out);
    qsa_free(err);
    remove(path);
    rmdir(dir);
}

/* Runs the shell command `cmd` in the repository root; returns its exit status (-1 when it did not exit)
   and its stderr in *err (free it). */
static int cli_shell(const char *cmd, char **err) {
    char dir[] = "/tmp/qsa_cli_XXXXXX", full[8192], perr[64];
    *err = NULL;
    if (!mkdtemp(dir)) return -1;
    snprintf(perr, sizeof perr, "%s/err", dir);
    snprintf(full, sizeof full, "cd '%s' && ( %s ) > /dev/null 2> %s", test_path(""), cmd, perr);
    int st = system(full);
    size_t len = 0;
    if (qsa__read_file(perr, err, &len) != QSA_OK) *err = NULL;
    remove(perr);
    rmdir(dir);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The tools' flags read strictly (atoi took "abc" as 0; replay crashed on a flag without its value),
   tokenize --decode of a file of ids (it read past the end of its buffer and refused the last id of a
   440-id file), logits on a prompt that fills the model's context (it asked for one position more), and output
   that cannot be written. */
TEST(cpu, tool_flags_and_inputs) {
    if (!qsa__file_exists(test_path("tools/replay")) || !qsa__file_exists(test_path("tools/tokenize")) ||
        !qsa__file_exists(test_path("tools/logits")) || !qsa__file_exists(test_path("models/tiny/config.json")))
        SKIP("the tools or models/tiny are not built (make)");
    char *err = NULL;
    int rc = cli_shell("tools/replay capture --model models/tiny --ids x --out y --layer", &err);
    CHECKF(rc == 2 && cli_count(err, "--layer needs a value"), "status %d, stderr '%.300s'", rc, err ? err : "");
    qsa_free(err);
    rc = cli_shell("tools/replay capture --model models/tiny --ids x --out y --layer 4294967299", &err);
    CHECKF(rc == 2 && cli_count(err, "'4294967299' is not a whole number"), "status %d, stderr '%.300s'", rc, err ? err : "");
    qsa_free(err);
    rc = cli_shell("tools/logits --model models/tiny --ids x --out y --decode abc", &err);
    CHECKF(rc == 2 && cli_count(err, "--decode: 'abc'"), "status %d, stderr '%.300s'", rc, err ? err : "");
    qsa_free(err);
    rc = cli_shell("tools/logits --model models/tiny --ids x --out y --backend foo", &err);
    CHECKF(rc == 2 && cli_count(err, "'foo' is not auto, cpu or cuda"), "status %d, stderr '%.300s'", rc, err ? err : "");
    qsa_free(err);
    rc = cli_shell("tools/make_tiny_model /tmp/qsa_never_written --seed -1", &err);
    CHECKF(rc == 2 && cli_count(err, "--seed: '-1'"), "status %d, stderr '%.300s'", rc, err ? err : "");
    qsa_free(err);
    rc = cli_shell("tools/long_context --backend cpu --tokens 10 --gen 2 --pool-tokens 2147483648", &err);
    CHECKF(rc == 2 && cli_count(err, "--pool-tokens expects an integer in 1 .. 2147483647"), "status %d, stderr '%.300s'", rc,
           err ? err : "");
    qsa_free(err);
    char dir[] = "/tmp/qsa_tools_XXXXXX", cmd[1024], p1[96], p2[96];
    if (!mkdtemp(dir)) SKIP("mkdtemp");
    /* output that cannot be written fails the program (tokenize --help and replay's report exited 0) */
    rc = cli_shell("tools/tokenize --model models/tiny --text hello > /dev/full", &err);
    CHECKF(rc == 1 && cli_count(err, "tokenize: writing the output failed: No space left on device"), "status %d, stderr '%.300s'", rc,
           err ? err : "");
    qsa_free(err);
    rc = cli_shell("tools/tokenize --help > /dev/full", &err);
    CHECKF(rc == 1 && cli_count(err, "writing the output failed"), "status %d, stderr '%.300s'", rc, err ? err : "");
    qsa_free(err);
    snprintf(cmd, sizeof cmd, "echo '[1,2,3,4,5,6,7,8]' > %s/c.json && tools/replay capture --model models/tiny --ids %s/c.json --out %s/c.qsacap "
             "--layer 3 && tools/replay replay %s/c.qsacap > /dev/full", dir, dir, dir, dir);
    rc = cli_shell(cmd, &err);
    CHECKF(rc == 1 && cli_count(err, "replay: writing the output failed"), "status %d, stderr '%.300s'", rc, err ? err : "");
    qsa_free(err);
    snprintf(p1, sizeof p1, "%s/ids.txt", dir);
    FILE *f = fopen(p1, "wb");
    for (int i = 0; f && i < 440; i++) fprintf(f, "%s%d", i ? " " : "", i == 439 ? 11 : 5);
    if (f) fclose(f);
    snprintf(cmd, sizeof cmd, "tools/tokenize --model models/tiny --decode --text-file '%s'", p1);
    rc = cli_shell(cmd, &err);
    CHECKF(rc == 0, "status %d, stderr '%.300s'", rc, err ? err : "");
    qsa_free(err);
    /* a prompt of max_position_embeddings ids (models/tiny: 4,096) */
    int maxpos = 0;
    qsa_model_config c;
    if (qsa_config_load_dir(test_path("models/tiny"), &c) == QSA_OK) maxpos = c.max_position_embeddings;
    snprintf(p2, sizeof p2, "%s/ids.json", dir);
    f = fopen(p2, "wb");
    for (int i = 0; f && i < maxpos; i++) fprintf(f, "%s%d", i ? "," : "[", (i * 37 + 11) % 200);
    if (f) { fputs("]", f); fclose(f); }
    snprintf(cmd, sizeof cmd, "tools/logits --backend cpu --model models/tiny --ids '%s' --out '%s/l.safetensors'", p2, dir);
    rc = maxpos > 0 ? cli_shell(cmd, &err) : -1;
    CHECKF(rc == 0, "status %d, stderr '%.300s'", rc, err ? err : "");
    qsa_free(err);
    char p3[128];
    snprintf(p3, sizeof p3, "%s/l.safetensors", dir);
    remove(p1);
    remove(p2);
    remove(p3);
    snprintf(p3, sizeof p3, "%s/c.json", dir);
    remove(p3);
    snprintf(p3, sizeof p3, "%s/c.qsacap", dir);
    remove(p3);
    rmdir(dir);
}

/* Processes whose command line contains s and, unless NULL, s2 (Linux /proc); *pid (unless NULL) the last */
static int tp_cmdline_find(const char *s, const char *s2, pid_t *pid) {
    DIR *d = opendir("/proc");
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[300], buf[4096];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < k; i++)
            if (!buf[i]) buf[i] = ' ';
        buf[k] = 0;
        if (!strstr(buf, s) || (s2 && !strstr(buf, s2))) continue;
        n++;
        if (pid) *pid = (pid_t)atoi(e->d_name);
    }
    if (d) closedir(d);
    return n;
}
static int tp_cmdline_count(const char *s) { return tp_cmdline_find(s, NULL, NULL); }

/* tp_launch -n 2 with its ranks held by a FIFO as the driver library (QSA_CUDA_LIB: dlopen's open blocks until a
   writer comes); the ranks are found by their prompt, the FIFO's directory dir (mkdtemp'd by the caller).  The
   launcher's stderr goes to errpath (NULL: /dev/null).  0 if it could not be set up; else the launcher's pid, once its
   two ranks run. */
static pid_t tp_launch_held(const char *dir, const char *errpath) {
    char fifo[64];
    snprintf(fifo, sizeof fifo, "%s/libcuda.so.1", dir);
    if (mkfifo(fifo, 0600) != 0) return 0;
    char exe[600], model[600];
    snprintf(exe, sizeof exe, "%s", test_path("examples/tp_launch"));
    snprintf(model, sizeof model, "%s", test_path("models/tiny"));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int dn = open("/dev/null", O_WRONLY), ef = errpath ? open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600) : dn;
        if (dn >= 0) dup2(dn, 1);
        if (ef >= 0) dup2(ef, 2);
        setenv("QSA_CUDA_LIB", fifo, 1);
        execl(exe, exe, "-n", "2", "-m", model, "-p", dir, (char *)NULL);
        _exit(127);
    }
    int ranks = 0; /* processes whose command line names the FIFO's directory, the launcher's own included */
    for (int t = 0; t < 1000 && ranks < 3; t++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        ranks = tp_cmdline_count(dir);
    }
    CHECKF(ranks == 3, "%d processes", ranks);
    return pid;
}

/* The launcher's status, waited for up to 30 s; 0 if it did not end (it is then killed, and the test fails
   where it hung CI before: a rank that took the launcher's SIGTERM between its fork and its exec ran on,
   held by the FIFO, and the launcher waited for it) */
static int tp_launch_wait(pid_t pid, int *st) {
    for (int t = 0; t < 3000; t++) {
        if (waitpid(pid, st, WNOHANG) == pid) return 1;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, st, 0);
    return 0;
}

/* Waits until no process names dir, and kills those still there after 10 s; removes the FIFO and dir.  The
   processes that were left. */
static int tp_launch_reap(const char *dir) {
    int left = 0;
    for (int t = 0; t < 1000 && (left = tp_cmdline_count(dir)) > 0; t++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    pid_t p = 0;
    for (int t = 0; t < 100 && tp_cmdline_find(dir, NULL, &p) > 0; t++) {
        kill(p, SIGKILL);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    char fifo[64];
    snprintf(fifo, sizeof fifo, "%s/libcuda.so.1", dir);
    remove(fifo);
    rmdir(dir);
    return left;
}

/* A signal to tp_launch reaches its ranks, and the launcher removes its rendezvous directory and dies of
   it (the ranks went on running and the directory stayed). */
TEST(cpu, tp_launch_passes_signals_to_its_ranks) {
    if (!qsa__file_exists(test_path("examples/tp_launch")) || !qsa__file_exists(test_path("models/tiny/config.json")))
        SKIP("examples/tp_launch or models/tiny is not built");
    char dir[] = "/tmp/qsa_tpl_XXXXXX";
    if (!mkdtemp(dir)) SKIP("mkdtemp");
    pid_t pid = tp_launch_held(dir, NULL);
    if (!pid) { rmdir(dir); SKIP("mkfifo"); }
    kill(pid, SIGTERM);
    int st = 0;
    CHECKF(tp_launch_wait(pid, &st), "the launcher did not end within 30 s of its SIGTERM");
    CHECKF(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "launcher status %d", st);
    int left = tp_launch_reap(dir);
    CHECKF(left == 0, "%d rank processes left running", left);
}

/* A rank that dies makes the launcher stop the other, which it counts as stopped, not failed ("2 of 2 ranks
   failed" when one failed). */
TEST(cpu, tp_launch_counts_the_ranks_it_stopped_apart) {
    if (!qsa__file_exists(test_path("examples/tp_launch")) || !qsa__file_exists(test_path("models/tiny/config.json")))
        SKIP("examples/tp_launch or models/tiny is not built");
    char dir[] = "/tmp/qsa_tpl_XXXXXX", errpath[64];
    if (!mkdtemp(dir)) SKIP("mkdtemp");
    snprintf(errpath, sizeof errpath, "%s.err", dir);
    pid_t pid = tp_launch_held(dir, errpath);
    if (!pid) { rmdir(dir); SKIP("mkfifo"); }
    pid_t r1 = 0; /* (a rank between its fork and its exec still has the launcher's command line) */
    for (int t = 0; t < 1000 && tp_cmdline_find(dir, "--rank 1 ", &r1) == 0; t++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK(r1 > 0);
    if (r1 > 0) kill(r1, SIGKILL);
    else kill(pid, SIGTERM);
    int st = 0;
    CHECKF(tp_launch_wait(pid, &st), "the launcher did not end within 30 s of its rank's death");
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 1, "launcher status %d", st);
    int left = tp_launch_reap(dir);
    CHECKF(left == 0, "%d rank processes left running", left);
    char *err = NULL;
    size_t n = 0;
    CHECK_OK(qsa__read_file(errpath, &err, &n));
    CHECKF(err && strstr(err, "tp_launch: rank 1 failed; stopping the others") &&
               strstr(err, "tp_launch: 1 of 2 ranks failed, 1 stopped by the launcher"), "stderr '%.400s'", err ? err : "");
    qsa_free(err);
    remove(errpath);
}

/* chat takes its sampling defaults from generation_config.json: do_sample false alone is greedy (it
   sampled at 0.7), and min_p and repetition_penalty apply (they were read and dropped). */
TEST(cpu, chat_sampling_defaults_from_generation_config) {
    if (!qsa__file_exists(test_path("examples/chat")) || !qsa__file_exists(test_path("models/tiny/config.json")))
        SKIP("examples/chat or models/tiny is not built (make)");
    char dir[] = "/tmp/qsa_gencfg_XXXXXX", cmd[PATH_MAX + 64], args[1024];
    if (!mkdtemp(dir)) SKIP("mkdtemp");
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        char src[PATH_MAX], dst[1024];
        if (!realpath(test_path("models/tiny"), src)) SKIP("realpath");
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        snprintf(cmd, sizeof cmd, "%s/%s", src, files[i]);
        CHECK(symlink(cmd, dst) == 0);
    }
    char gc[1100];
    snprintf(gc, sizeof gc, "%s/generation_config.json", dir);
    FILE *f = fopen(gc, "wb");
    if (f) { fputs("{\"do_sample\": false, \"eos_token_id\": [1023, 1021]}", f); fclose(f); }
    char *out[4] = {0}, *err = NULL;
    const char *extra[4] = {"-s 1", "-s 2", "--temp 0", "-s 1 --temp 0.7"};
    for (int i = 0; i < 4; i++) {
        snprintf(args, sizeof args, "-m %s -p 'Hello there' -n 16 --no-stats %s", dir, extra[i]);
        int rc = cli_chat(args, "", 0, &out[i], &err);
        CHECKF(rc == 0 && out[i], "status %d, stderr '%.300s'", rc, err ? err : "");
        qsa_free(err);
    }
    CHECK(out[0] && out[1] && out[2] && !strcmp(out[0], out[1]) && !strcmp(out[0], out[2])); /* greedy whatever the seed */
    CHECK(out[0] && out[3] && strcmp(out[0], out[3]) != 0); /* --temp still samples */
    /* min_p and repetition_penalty: the config's values equal the same flags */
    f = fopen(gc, "wb");
    if (f) {
        fputs("{\"do_sample\": true, \"temperature\": 0.9, \"min_p\": 0.3, \"repetition_penalty\": 3.0, \"eos_token_id\": [1023]}", f);
        fclose(f);
    }
    char *cfg = NULL, *flags = NULL, *plain = NULL;
    snprintf(args, sizeof args, "-m %s -p 'Hello there' -n 24 --no-stats -s 3", dir);
    CHECK(cli_chat(args, "", 0, &cfg, &err) == 0);
    qsa_free(err);
    snprintf(args, sizeof args, "-m %s -p 'Hello there' -n 24 --no-stats -s 3 --min-p 0.3 --repeat-penalty 3", dir);
    CHECK(cli_chat(args, "", 0, &flags, &err) == 0);
    qsa_free(err);
    snprintf(args, sizeof args, "-m %s -p 'Hello there' -n 24 --no-stats -s 3 --min-p 0 --repeat-penalty 1", dir);
    CHECK(cli_chat(args, "", 0, &plain, &err) == 0);
    qsa_free(err);
    CHECK(cfg && flags && plain && !strcmp(cfg, flags) && strcmp(cfg, plain) != 0);
    for (int i = 0; i < 4; i++) qsa_free(out[i]);
    qsa_free(cfg); qsa_free(flags); qsa_free(plain);
    remove(gc);
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "%s/%s", dir, files[i]);
        remove(cmd);
    }
    rmdir(dir);
}

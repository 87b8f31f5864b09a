/* nestguard: loaded (LD_PRELOAD) into the launcher of a pytest or plain-runner grading (the
 * Python process that runs the hidden tests), so that every program it starts runs in a
 * Landlock domain of its own.
 *
 * A domain decides who reaches a process: another process may trace it, read or write its
 * memory (/proc/PID/mem) or reopen its descriptors (/proc/PID/fd/N) only from the same domain
 * or from one the target's is nested in (signals stay open: see enter_own_domain). Without this library every program a
 * test starts shares the launcher's domain, so the tested code, run by a test as a program,
 * read the memory of a judge the test started beside it and wrote a later checker's output
 * through its stdout pipe (red team, round fifty-one: 1.0 each, with wrong work). With it,
 * two programs a test starts are out of each other's reach (and of each other's children's:
 * a child keeps its parent's domain), while the launcher, an ancestor of every domain, still
 * waits on, signals and reads them as before. The domain restricts no file access (see
 * enter_own_domain).
 *
 * A shell the launcher starts keeps the library (`subprocess.run("judge & guess", shell=True)`,
 * os.system, a script whose #! names a shell), so each program of a command line is a domain
 * of its own too, as in the script runner (red team, round fifty-two: a judge and the tested
 * code started side by side by one shell shared its domain). Any other program runs without
 * it: this library is taken out of its LD_PRELOAD (a library the test preloads itself stays)
 * and TEMPERING_NEST out of its environment, so what it starts is its own business, in its
 * own domain, as with a program a test script's shell starts (execguard.c).
 *
 * Every way glibc offers to start a program goes through guarded_exec (exec_hooks.h); an exec
 * that cannot enter its domain fails (EPERM): fail closed. posix_spawn is refused (the
 * launcher turns it off in Python's subprocess).
 *
 * TEMPERING_NEST=1 in the environment turns it on; the constructor then sets it to "loaded",
 * which the launcher checks before it runs anything (a Python that did not load the library
 * is not graded). Only symbols of glibc 2.2.5 are used, so it loads into any glibc's Python.
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "domains.h"
#include "exec_hooks.h"

static int active;
static char self_path[PRELOAD_MAX];  /* this library, as LD_PRELOAD names it */

static const char *const SHELLS[] = { "sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", NULL };

static int named_shell(const char *path, size_t n) {
    const char *base = path;
    for (size_t i = 0; i < n; i++)
        if (path[i] == '/') base = path + i + 1;
    size_t len = (size_t)(path + n - base);
    for (int i = 0; SHELLS[i] != NULL; i++)
        if (strlen(SHELLS[i]) == len && strncmp(base, SHELLS[i], len) == 0) return 1;
    return 0;
}

/* Whether the program `path` names is a shell: by its name, or by the interpreter its #! line
 * names (`#!/bin/sh`, `#!/usr/bin/env bash`). */
static int is_shell(int dirfd, const char *path, int flags) {
    if (flags & AT_EMPTY_PATH) return 0;
    if (named_shell(path, strlen(path))) return 1;
    int fd = (int)syscall(SYS_openat, dirfd, path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return 0;
    char line[256];
    ssize_t got = read(fd, line, sizeof line - 1);
    close(fd);
    if (got < 2 || line[0] != '#' || line[1] != '!') return 0;
    line[got] = 0;
    char *p = line + 2;
    p += strspn(p, " \t");
    size_t n = strcspn(p, " \t\n");
    if (n >= 4 && strncmp(p + n - 4, "/env", 4) == 0) {  /* #!/usr/bin/env NAME */
        p += n;
        p += strspn(p, " \t");
        if (strncmp(p, "-S", 2) == 0) { p += 2; p += strspn(p, " \t"); }
        n = strcspn(p, " \t\n");
    }
    return n > 0 && named_shell(p, n);
}

static int guarded_exec(int dirfd, const char *path, char *const argv[], char *const envp[],
                        int flags) {
    if (!active)
        return (int)syscall(SYS_execveat, dirfd, path, argv, envp, flags);
    /* A path that is not there, or not executable, fails as the exec would, before a
     * domain is entered: Python's subprocess tries each directory of PATH in turn, and each
     * domain is one of Landlock's sixteen layers. */
    if (!(flags & AT_EMPTY_PATH) && syscall(SYS_faccessat, dirfd, path, X_OK) != 0)
        return -1;
    /* No heap: in the child of a vfork this is the launcher's memory. */
    char *env[ENV_MAX], preload[PRELOAD_MAX];
    if (program_env(envp, env, preload, self_path, "TEMPERING_NEST=",
                    is_shell(dirfd, path, flags) ? "TEMPERING_NEST=1" : NULL) < 0) {
        errno = E2BIG;
        return -1;
    }
    /* Entered at every exec, never skipped on a note that it was: a vfork child's note is
     * its parent's memory (round forty-eight). */
    if (enter_own_domain() < 0) {
        errno = EPERM;
        return -1;
    }
    return (int)syscall(SYS_execveat, dirfd, path, argv, env, flags);
}

__attribute__((constructor)) static void start(void) {
    const char *on = getenv("TEMPERING_NEST");
    if (on == NULL || strcmp(on, "1") != 0) return;
    active = 1;
    find_self("nestguard.so", self_path, sizeof self_path);
    setenv("TEMPERING_NEST", "loaded", 1);
}

/* nestguard: loaded (LD_PRELOAD) into the launcher of a pytest or plain-runner grading (the
 * Python process that runs the hidden tests), so that every program it starts runs in a
 * Landlock domain of its own.
 *
 * A domain decides who reaches a process: another process may trace it, read or write its
 * memory (/proc/PID/mem) or reopen its descriptors (/proc/PID/fd/N) only from the same domain
 * or from one the target's is nested in. Without this library every program a test starts
 * shares the launcher's domain, so the tested code, run by a test as a program, read the
 * memory of a judge the test started beside it and wrote a later checker's output through its
 * stdout pipe (red team, round fifty-one: 1.0 each, with wrong work). With it, two programs a
 * test starts are out of each other's reach (and of each other's children's: a child keeps
 * its parent's domain), while the launcher, an ancestor of every domain, still waits on,
 * signals and reads them as before. The domain restricts nothing else (see enter_own_domain).
 *
 * Every way glibc offers to start a program goes through guarded_exec (exec_hooks.h); an exec
 * that cannot enter its domain fails (EPERM): fail closed. The program runs without this
 * library: LD_PRELOAD and TEMPERING_NEST are taken out of its environment, so what it starts
 * is its own business, in its own domain, as with a program a test script's shell starts
 * (execguard.c). posix_spawn is refused (the launcher turns it off in Python's subprocess).
 *
 * TEMPERING_NEST=1 in the environment turns it on; the constructor then sets it to "loaded",
 * which the launcher checks before it runs anything (a Python that did not load the library
 * is not graded). Only symbols of glibc 2.2.5 are used, so it loads into any glibc's Python.
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "domains.h"

#define ENV_MAX 8192

static int active;

static int ours(const char *entry) {
    return !strncmp(entry, "LD_PRELOAD=", 11) || !strncmp(entry, "TEMPERING_NEST=", 15);
}

static int guarded_exec(int dirfd, const char *path, char *const argv[], char *const envp[],
                        int flags) {
    if (!active)
        return (int)syscall(SYS_execveat, dirfd, path, argv, envp, flags);
    char *env[ENV_MAX];  /* no heap: in the child of a vfork this is the launcher's memory */
    size_t n = 0, k = 0;
    while (envp && envp[n]) n++;
    if (n + 1 > ENV_MAX) { errno = E2BIG; return -1; }
    /* A path that is not there, or not executable, fails as the exec would, before a
     * domain is entered: Python's subprocess tries each directory of PATH in turn, and each
     * domain is one of Landlock's sixteen layers. */
    if (!(flags & AT_EMPTY_PATH) && syscall(SYS_faccessat, dirfd, path, X_OK) != 0)
        return -1;
    /* Entered at every exec, never skipped on a note that it was: a vfork child's note is
     * its parent's memory (round forty-eight). */
    if (enter_own_domain() < 0) {
        errno = EPERM;
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (!ours(envp[i])) env[k++] = envp[i];
    env[k] = NULL;
    return (int)syscall(SYS_execveat, dirfd, path, argv, env, flags);
}

#include "exec_hooks.h"

__attribute__((constructor)) static void start(void) {
    const char *on = getenv("TEMPERING_NEST");
    if (on == NULL || strcmp(on, "1") != 0) return;
    active = 1;
    setenv("TEMPERING_NEST", "loaded", 1);
}

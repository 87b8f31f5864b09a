/*
 * exec_hooks.h: every way glibc offers a program to start another, routed through one
 * function of the preloaded library's, guarded_exec(dirfd, path, argv, envp, flags) (an
 * execveat), which the including file defines first. Shared by execguard.c and nestguard.c.
 *
 * glibc's own wrappers reach the kernel by internal names that no preloaded library sees, so
 * each is defined here on top of guarded_exec: the exec family (l- and p-variants search PATH
 * here), and system(). posix_spawn and posix_spawnp are refused (EPERM): their child execs
 * inside glibc, unseen, and its file actions are glibc's private layout (Python's subprocess
 * does not use them with close_fds, its default; the guards' users turn them off). popen and
 * wordexp, which glibc implements with its internal posix_spawn, are not defined here: nothing
 * the guards watch calls them (a shell, a Python launcher).
 *
 * No heap: each may run in the child of a vfork, which shares its parent's memory.
 */
#ifndef TEMPERING_EXEC_HOOKS_H
#define TEMPERING_EXEC_HOOKS_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define ENV_MAX 8192
#define PRELOAD_MAX 4096

/* The path this library was preloaded by: the entry of LD_PRELOAD named `file` (its own file
 * name), copied into `self` at start (empty when there is none). */
static void find_self(const char *file, char *self, size_t size) {
    const char *list = getenv("LD_PRELOAD");
    size_t want = strlen(file);
    self[0] = 0;
    while (list != NULL && *list) {
        size_t n = strcspn(list, ": ");
        if (n >= want && n < size && strncmp(list + n - want, file, want) == 0
                && (n == want || list[n - want - 1] == '/')) {
            memmove(self, list, n);
            self[n] = 0;
            return;
        }
        list += n + (list[n] != 0);
    }
}

/* The environment a program starts with, in `out` (ENV_MAX entries, NULL-terminated): `envp`
 * without this library's own variables (those starting with `own`) and without `self` in
 * LD_PRELOAD; any other library there stays (a test's own preload is the test's). With
 * `keep` (a variable such as "TEMPERING_NEST=1"), the library stays instead, first in
 * LD_PRELOAD, and `keep` is added. `preload` (PRELOAD_MAX bytes) holds the new LD_PRELOAD
 * entry. -1 when it does not fit (E2BIG). */
static int program_env(char *const envp[], char **out, char *preload, const char *self,
                       const char *own, const char *keep) {
    size_t k = 0, len = strlen("LD_PRELOAD="), own_len = strlen(own);
    memmove(preload, "LD_PRELOAD=", len + 1);
    if (keep != NULL && self[0]) {
        if (len + strlen(self) + 1 > PRELOAD_MAX) return -1;
        len += (size_t)snprintf(preload + len, PRELOAD_MAX - len, "%s", self);
    }
    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++) {
        if (k + 3 > ENV_MAX) return -1;
        if (strncmp(envp[i], own, own_len) == 0) continue;
        if (strncmp(envp[i], "LD_PRELOAD=", 11) != 0) {
            out[k++] = envp[i];
            continue;
        }
        for (const char *p = envp[i] + 11; *p; ) {
            size_t n = strcspn(p, ": ");
            if (n > 0 && !(strlen(self) == n && strncmp(p, self, n) == 0)) {
                if (len + n + 2 > PRELOAD_MAX) return -1;
                if (len > 11) preload[len++] = ':';
                memmove(preload + len, p, n);
                len += n;
                preload[len] = 0;
            }
            p += n + (p[n] != 0);
        }
    }
    if (len > 11) out[k++] = preload;  /* a library in it */
    if (keep != NULL) out[k++] = (char *)keep;
    out[k] = NULL;
    return 0;
}

static int guarded_exec(int dirfd, const char *path, char *const argv[], char *const envp[],
                        int flags);

int execve(const char *path, char *const argv[], char *const envp[]) {
    return guarded_exec(AT_FDCWD, path, argv, envp, 0);
}

int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags) {
    return guarded_exec(dirfd, path, argv, envp, flags);
}

int fexecve(int fd, char *const argv[], char *const envp[]) {
    return guarded_exec(fd, "", argv, envp, AT_EMPTY_PATH);
}

int execv(const char *path, char *const argv[]) {
    return guarded_exec(AT_FDCWD, path, argv, environ, 0);
}

/* The p-variants search PATH here (glibc's would reach the kernel by an internal name). */
int execvpe(const char *file, char *const argv[], char *const envp[]) {
    if (strchr(file, '/') != NULL) return guarded_exec(AT_FDCWD, file, argv, envp, 0);
    const char *search = getenv("PATH");
    if (search == NULL) search = "/usr/local/bin:/usr/bin:/bin";
    char path[4096];
    int seen_eacces = 0;
    for (const char *p = search; ; ) {
        const char *end = strchr(p, ':');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        snprintf(path, sizeof path, "%.*s%s%s", (int)n, p, n ? "/" : "", file);
        guarded_exec(AT_FDCWD, path, argv, envp, 0);
        if (errno == EACCES) seen_eacces = 1;
        else if (errno != ENOENT && errno != ENOTDIR) return -1;
        if (end == NULL) break;
        p = end + 1;
    }
    errno = seen_eacces ? EACCES : ENOENT;
    return -1;
}

int execvp(const char *file, char *const argv[]) {
    return execvpe(file, argv, environ);
}

/* The l-variants: their arguments gathered on the stack (at most EXEC_LIST_MAX). */
#define EXEC_LIST_MAX 4096
#define GATHER(first, args, argv, count)                                           \
    do {                                                                           \
        argv[0] = (char *)(first);                                                 \
        for (count = 1; argv[count - 1] != NULL; count++) {                        \
            if (count == EXEC_LIST_MAX) { errno = E2BIG; va_end(args); return -1; } \
            argv[count] = va_arg(args, char *);                                    \
        }                                                                          \
    } while (0)

int execl(const char *path, const char *arg, ...) {
    char *argv[EXEC_LIST_MAX];
    size_t count;
    va_list args;
    va_start(args, arg);
    GATHER(arg, args, argv, count);
    va_end(args);
    return guarded_exec(AT_FDCWD, path, argv, environ, 0);
}

int execle(const char *path, const char *arg, ...) {
    char *argv[EXEC_LIST_MAX];
    size_t count;
    va_list args;
    va_start(args, arg);
    GATHER(arg, args, argv, count);
    char *const *envp = va_arg(args, char *const *);
    va_end(args);
    return guarded_exec(AT_FDCWD, path, argv, envp, 0);
}

int execlp(const char *file, const char *arg, ...) {
    char *argv[EXEC_LIST_MAX];
    size_t count;
    va_list args;
    va_start(args, arg);
    GATHER(arg, args, argv, count);
    va_end(args);
    return execvpe(file, argv, environ);
}

/* system(3) as POSIX has it: `sh -c command`, SIGINT and SIGQUIT ignored and SIGCHLD blocked
 * in the caller while it runs; its status as waitpid gives it, 127 in it when the shell
 * could not start. */
int system(const char *command) {
    if (command == NULL) return 1;  /* a shell is there */
    struct sigaction ignore = { .sa_handler = SIG_IGN }, intr, quit;
    sigemptyset(&ignore.sa_mask);
    sigset_t chld, saved;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigaction(SIGINT, &ignore, &intr);
    sigaction(SIGQUIT, &ignore, &quit);
    sigprocmask(SIG_BLOCK, &chld, &saved);
    int status = -1;
    pid_t pid = fork();
    if (pid == 0) {
        sigaction(SIGINT, &intr, NULL);
        sigaction(SIGQUIT, &quit, NULL);
        sigprocmask(SIG_SETMASK, &saved, NULL);
        char *argv[] = { "sh", "-c", (char *)command, NULL };
        guarded_exec(AT_FDCWD, "/bin/sh", argv, environ, 0);
        _exit(127);
    }
    if (pid > 0) {
        while (waitpid(pid, &status, 0) < 0) {
            if (errno != EINTR) { status = -1; break; }
        }
    }
    int err = errno;
    sigaction(SIGINT, &intr, NULL);
    sigaction(SIGQUIT, &quit, NULL);
    sigprocmask(SIG_SETMASK, &saved, NULL);
    errno = err;
    return status;
}

int posix_spawn(void *pid, const char *path, const void *actions, const void *attr,
                char *const argv[], char *const envp[]) {
    (void)pid; (void)path; (void)actions; (void)attr; (void)argv; (void)envp;
    return EPERM;  /* its child would exec unseen by guarded_exec */
}

int posix_spawnp(void *pid, const char *file, const void *actions, const void *attr,
                 char *const argv[], char *const envp[]) {
    (void)pid; (void)file; (void)actions; (void)attr; (void)argv; (void)envp;
    return EPERM;
}

#endif

/* execguard: loaded (LD_PRELOAD) into the shell that runs a task's test script, so that no
 * program the script starts can write one directory: the one its verdict is kept in.
 *
 * The shell itself keeps every right: its own redirections (`echo 1 > FILE`) write the
 * verdict, as do its forks that run no program (subshells). Every program it starts is
 * exec'd under a Landlock domain in which nothing below $TEMPERING_GUARDED can be created,
 * written, truncated, removed, linked or renamed (everything else can, as before), and which
 * the program and everything it starts inherit, whatever they are linked against or do to
 * their environment: the kernel keeps the domain, not this library (which the program does
 * not load: it is taken out of LD_PRELOAD, where a library the script preloads itself stays,
 * and the TEMPERING_GUARD variables out of its environment).
 * Landlock also keeps a program in the domain from tracing the shell or writing its memory
 * (ptrace, /proc/PID/mem) and, with ABI 6, from signalling it.
 *
 * The shell itself may reach the files it keeps its verdict in (TEMPERING_GUARD_KEEP: a list
 * of LINK=FILE, each FILE below $TEMPERING_GUARDED and LINK the name the script writes it by)
 * only by those names: an open of the shell's (or of its forks, before they exec) that lands
 * on a kept FILE is refused (EACCES) unless the path it was given is LINK's directory and name
 * and LINK is still the link it was when the shell started. A program cannot write the
 * verdict, but it can plant a link anywhere it writes (/tmp/out.txt -> FILE) and wait for the
 * shell's `prog > /tmp/out.txt` to open it (red team, round forty-five).
 *
 * The first program the shell execs in its own place (`bash -c 'bash tests/test.sh'`, which
 * bash runs by exec) becomes the shell, and loads this library again; any later one is
 * restricted like a child's. An exec that cannot be restricted fails (EPERM): fail closed.
 *
 * TEMPERING_GUARD_PROBE set: the library's constructor exits at once with 97 when Landlock
 * can be used here, 98 when not, before the program runs (the grader's check that the shell
 * of this environment loads it).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "domains.h"
#include "exec_hooks.h"


static char guarded[512];   /* absolute, normalised: the directory no program may write */
static char self_path[PRELOAD_MAX];  /* this library, as LD_PRELOAD names it */
static int is_shell;        /* this process is the script's shell (or became it by exec) */
static pid_t shell_pid;

/* The kept files and the links the script writes them by. */
#define MAX_KEPT 4
static struct kept {
    dev_t dev; ino_t ino;            /* the kept file */
    dev_t link_dev; ino_t link_ino;  /* its link, as the shell found it */
    char dir[PATH_MAX];              /* the link's directory, resolved */
    char name[256];                  /* the link's name */
} kept[MAX_KEPT];
static int kept_count;

static int open_raw(int dirfd, const char *path, int flags, mode_t mode) {
    return (int)syscall(SYS_openat, dirfd, path, flags, mode);
}

static uint64_t write_rights(long abi) {
    uint64_t rights = LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR |
        LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
        LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
        LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO |
        LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM;
    if (abi >= 2) rights |= LANDLOCK_ACCESS_FS_REFER;
    if (abi >= 3) rights |= LANDLOCK_ACCESS_FS_TRUNCATE;
    return rights;
}

/* This process, from now on: no write of any kind below `guarded`. Applied at every exec,
 * never skipped on a note of having been applied: a vfork child writes such a note into the
 * shell's memory, and a later child given the same pid (the pid space cycled by the tested
 * code) read it and exec'd with no domain at all (red team, round forty-eight: 1.0). An exec
 * retried along PATH stacks a layer per try, well within Landlock's sixteen. */
static int restrict_self(void) {
    long abi = landlock_abi();
    if (abi < 1) return -1;
    uint64_t rights = write_rights(abi);
    uint64_t file_rights = LANDLOCK_ACCESS_FS_WRITE_FILE |
        (abi >= 3 ? LANDLOCK_ACCESS_FS_TRUNCATE : 0);
    struct ruleset_attr attr = { .handled_access_fs = rights };
    if (abi >= 6) attr.scoped = SCOPE_SIGNAL;
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, ruleset_size(abi), 0);
    if (ruleset < 0) return -1;
    /* Walk down to the guarded directory: at each level, everything but the next step. */
    char prefix[512] = "/", component[256];
    const char *rest = guarded + 1;
    int ok = 0;
    while (ok == 0 && *rest) {
        const char *slash = strchr(rest, '/');
        size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
        if (n == 0 || n >= sizeof component) { ok = -1; break; }
        memcpy(component, rest, n);
        component[n] = 0;
        ok = grant_siblings(ruleset, prefix, component, rights, file_rights);
        if (strcmp(prefix, "/")) strncat(prefix, "/", sizeof prefix - strlen(prefix) - 1);
        strncat(prefix, component, sizeof prefix - strlen(prefix) - 1);
        rest = slash ? slash + 1 : rest + n;
    }
    if (ok < 0) {
        close(ruleset);
        return -1;
    }
    return enter_domain(ruleset);
}

/* Whether `path` (as given to openat with `dirfd`) is the name of kept file `k`'s link: the
 * link's directory and its name, whatever is there now. */
static int names_link(int dirfd, const char *path, const struct kept *k) {
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (strcmp(name, k->name) != 0) return 0;
    char parent[PATH_MAX], resolved[PATH_MAX];
    if (slash == path) snprintf(parent, sizeof parent, "/");
    else if (slash != NULL && path[0] == '/')
        snprintf(parent, sizeof parent, "%.*s", (int)(slash - path), path);
    else if (dirfd == AT_FDCWD)
        snprintf(parent, sizeof parent, "./%.*s", slash ? (int)(slash - path) : 0, path);
    else
        snprintf(parent, sizeof parent, "/proc/self/fd/%d/%.*s", dirfd,
                 slash ? (int)(slash - path) : 0, path);
    /* An absolute path is taken as written: a directory a program replaced with a link to
     * the verdict's (/tmp/res -> /logs/verifier) is not the verdict's directory. */
    if (path[0] == '/' && strcmp(parent, k->dir) != 0) return 0;
    return realpath(parent, resolved) != NULL && strcmp(resolved, k->dir) == 0;
}

/* Whether `path` names kept file `k` by its link, and the link is still the grader's. */
static int by_its_link(int dirfd, const char *path, const struct kept *k) {
    struct stat link;
    return names_link(dirfd, path, k)
        && fstatat(dirfd, path, &link, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(link.st_mode)
        && link.st_dev == k->link_dev && link.st_ino == k->link_ino;
}

/* What the guard refused or saw fail, recorded where only the shell writes
 * ($TEMPERING_GUARDED/refused), through a descriptor opened when the shell started: a
 * program that lowered the shell's open-file limit cannot keep the record from being made
 * (round forty-five). Lines: "refused PATH" (an open the guard refused) or "failed PATH
 * ERRNO" (the shell's open of its verdict by its link failed: the verdict is void). */
static int record_fd = -1;
#define RECORD_BYTES (64 * 1024)

static void record(const char *what, const char *path, int err) {
    char line[PATH_MAX + 64];
    int n = err ? snprintf(line, sizeof line, "%s %s %d\n", what, path, err)
                : snprintf(line, sizeof line, "%s %s\n", what, path);
    if (record_fd >= 0 && write(record_fd, line, (size_t)(n < (int)sizeof line ? n :
                                                          (int)sizeof line - 1)) >= 0)
        return;
    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s/refused", guarded);
    int fd = open_raw(AT_FDCWD, file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
                      0600);
    if (fd < 0) return;
    if (write(fd, line, (size_t)(n < (int)sizeof line ? n : (int)sizeof line - 1)) < 0) {}
    close(fd);
}

static void open_record(void) {
    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s/refused", guarded);
    int fd = open_raw(AT_FDCWD, file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
                      0600);
    if (fd < 0) return;
    /* High, out of the way of the script's own `exec 3>...` */
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 900);
    if (high >= 0) {
        close(fd);
        fd = high;
    }
    /* Its pages taken now: a program that fills the disk cannot keep a line from being
     * written (round forty-five, the fourth red team). */
    if (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, RECORD_BYTES) < 0) {}
    record_fd = fd;
}

/* The shell's resource limits when it started: a program may lower them (prlimit needs only
 * the same uid; Landlock has no hook for it), so that the shell fails, and exits on its own,
 * before its later, lower verdict (RLIMIT_AS: bash's xrealloc of a $(...) buffer). At its
 * exit the shell compares; lowered limits void the verdict ("failed limits"). */
static struct rlimit limits_at_start[RLIM_NLIMITS];

static void note_limits(void) {
    for (int r = 0; r < RLIM_NLIMITS; r++) getrlimit(r, &limits_at_start[r]);
}

__attribute__((destructor)) static void check_limits(void) {
    if (!is_shell || getpid() != shell_pid) return;
    for (int r = 0; r < RLIM_NLIMITS; r++) {
        struct rlimit now;
        if (getrlimit(r, &now) == 0 && (now.rlim_cur < limits_at_start[r].rlim_cur
                                        || now.rlim_max < limits_at_start[r].rlim_max)) {
            char what[32];
            snprintf(what, sizeof what, "resource-limit-%d", r);
            record("failed", what, EPERM);
            return;
        }
    }
}

/* Whether descriptor `fd` is a file below the guarded directory, and which kept file it is
 * (-1: none of them). */
static int guarded_file(int fd, int *which) {
    char self[64], where[PATH_MAX];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(self, where, sizeof where - 1);
    if (n < 0) return 1;  /* cannot tell where it is: treated as guarded */
    where[n] = 0;
    size_t g = strlen(guarded);
    if (strncmp(where, guarded, g) != 0 || (where[g] != '/' && where[g] != 0)) return 0;
    struct stat st;
    *which = -1;
    if (fstat(fd, &st) == 0)
        for (int i = 0; i < kept_count; i++)
            if (st.st_dev == kept[i].dev && st.st_ino == kept[i].ino) *which = i;
    return 1;
}

/* Whether an open of `path` that reaches `fd`'s file may stand: everything outside the
 * guarded directory; inside, only a kept file named by its own link. */
static int may_open(int dirfd, const char *path, int fd) {
    int which = -1;
    if (!guarded_file(fd, &which)) return 1;
    return which >= 0 && by_its_link(dirfd, path, &kept[which]);
}

/* Which kept file `path` names by its link's name (-1: none). */
static int named_kept(int dirfd, const char *path) {
    for (int i = 0; i < kept_count; i++)
        if (names_link(dirfd, path, &kept[i])) return i;
    return -1;
}

/* Whether descriptor `fd`, opened by the name of kept file `i`'s link, is that kept file and
 * the link still the grader's. */
static int is_kept(int dirfd, const char *path, int fd, int i) {
    struct stat st;
    return fstat(fd, &st) == 0 && st.st_dev == kept[i].dev && st.st_ino == kept[i].ino
        && by_its_link(dirfd, path, &kept[i]);
}

/* An open of the shell's (or of a fork of it that has not exec'd). Decided on the file the
 * path reaches before it is opened for real (an O_PATH open: no truncation, no creation),
 * and again on the descriptor the real open gives (the path may have changed in between).
 * By a link's own name, the open must reach its kept file, and if it fails the verdict is
 * void: a program that renamed the link away for a decoy, lowered the shell's open-file
 * limit or made the kept file read-only kept the shell from writing its later, lower
 * verdict (round forty-five, the third red team). */
static int checked_open(int dirfd, const char *path, int flags, mode_t mode) {
    if (!is_shell)
        return open_raw(dirfd, path, flags, mode);
    int named = named_kept(dirfd, path);
    int probe = open_raw(dirfd, path, O_PATH | O_CLOEXEC | (flags & O_NOFOLLOW), 0);
    if (probe >= 0) {
        int ok = named >= 0 ? is_kept(dirfd, path, probe, named) : may_open(dirfd, path, probe);
        close(probe);
        if (!ok) {
            record("refused", path, 0);
            errno = EACCES;
            return -1;
        }
    }
    int fd = open_raw(dirfd, path, flags, mode);
    if (fd < 0) {
        int err = errno;
        if (named >= 0) record("failed", path, err);
        errno = err;
        return -1;
    }
    int ok = named >= 0 ? is_kept(dirfd, path, fd, named) : may_open(dirfd, path, fd);
    if (!ok) {
        close(fd);
        record("refused", path, 0);
        errno = EACCES;
        return -1;
    }
    return fd;
}

static mode_t mode_of(int flags, va_list args) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(args, mode_t) : 0;
}

/* open, open64, openat, openat64: the parameters before `flags` are the macro's last
 * arguments; the mode is there only with O_CREAT or O_TMPFILE. */
#define VARARGS_OPEN(name, dir, ...)                                              \
    int name(__VA_ARGS__, int flags, ...) {                                       \
        va_list args;                                                             \
        va_start(args, flags);                                                    \
        mode_t mode = mode_of(flags, args);                                       \
        va_end(args);                                                             \
        return checked_open(dir, path, flags, mode);                              \
    }
VARARGS_OPEN(open, AT_FDCWD, const char *path)
VARARGS_OPEN(open64, AT_FDCWD, const char *path)
VARARGS_OPEN(openat, dirfd, int dirfd, const char *path)
VARARGS_OPEN(openat64, dirfd, int dirfd, const char *path)

int __open_2(const char *path, int flags) { return checked_open(AT_FDCWD, path, flags, 0); }
int __open64_2(const char *path, int flags) { return checked_open(AT_FDCWD, path, flags, 0); }
int __openat_2(int dirfd, const char *path, int flags) {
    return checked_open(dirfd, path, flags, 0);
}
int __openat64_2(int dirfd, const char *path, int flags) {
    return checked_open(dirfd, path, flags, 0);
}

int creat(const char *path, mode_t mode) {
    return checked_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

int creat64(const char *path, mode_t mode) {
    return checked_open(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

/* TEMPERING_GUARD_KEEP="LINK=FILE:LINK=FILE": record each kept file and its link. */
static void keep(const char *spec) {
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", spec);
    for (char *item = strtok(copy, ":"); item && kept_count < MAX_KEPT; item = strtok(NULL, ":")) {
        char *eq = strchr(item, '=');
        if (eq == NULL) continue;
        *eq = 0;
        const char *link = item, *file = eq + 1;
        struct kept *k = &kept[kept_count];
        struct stat st, lst;
        const char *slash = strrchr(link, '/');
        if (slash == NULL || stat(file, &st) < 0 || lstat(link, &lst) < 0) continue;
        char parent[PATH_MAX];
        snprintf(parent, sizeof parent, "%.*s", (int)(slash - link), link);
        if (realpath(parent[0] ? parent : "/", k->dir) == NULL) continue;
        snprintf(k->name, sizeof k->name, "%s", slash + 1);
        k->dev = st.st_dev; k->ino = st.st_ino;
        k->link_dev = lst.st_dev; k->link_ino = lst.st_ino;
        kept_count++;
    }
}

/* Before a program runs: every descriptor of the shell's on a kept file closed, but its
 * standard output (`python3 -I grade.py > $VERIFIER_DIR/reward.json`, the verdict's helper).
 * Landlock decides at open, not at write: a script that opened its verdict up front (`exec
 * 3> $VERIFIER_DIR/reward.txt`) handed fd 3 to every program it ran, which wrote 1 into it
 * and moved its offset so that the shell's own later write failed (round forty-five, the
 * fourth red team). No heap: this runs in a vfork child too. */
static void close_kept_descriptors(void) {
    int dfd = open_raw(AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dfd < 0) return;
    char buf[4096];
    int found[256], count = 0;
    long n;
    while ((n = syscall(SYS_getdents64, dfd, buf, sizeof buf)) > 0) {
        for (long at = 0; at < n;) {
            struct dirent64_ *e = (struct dirent64_ *)(buf + at);
            at += e->reclen;
            int fd = atoi(e->name);
            if (e->name[0] < '0' || e->name[0] > '9' || fd == dfd || fd == 1) continue;
            struct stat st;
            if (fstat(fd, &st) < 0) continue;
            for (int i = 0; i < kept_count && count < 256; i++)
                if (st.st_dev == kept[i].dev && st.st_ino == kept[i].ino) found[count++] = fd;
        }
    }
    close(dfd);
    for (int i = 0; i < count; i++) close(found[i]);
}

/* A mark in the guarded directory saying whether the program the shell became by exec loaded
 * this library: "pending" before that exec, "loaded" from the program's constructor. The
 * grader refuses a verdict whose mark says pending (a static program in the shell's place
 * would start its own programs unrestricted). */
static void mark(const char *what) {
    char file[PATH_MAX];
    snprintf(file, sizeof file, "%s/shell", guarded);
    int fd = open_raw(AT_FDCWD, file, O_WRONLY | O_TRUNC | O_CREAT | O_CLOEXEC | O_NOFOLLOW,
                      0600);
    if (fd < 0) return;
    if (write(fd, what, strlen(what)) < 0) {}
    close(fd);
}

static int guarded_exec(int dirfd, const char *path, char *const argv[], char *const envp[],
                        int flags) {
    /* No heap from here on: in the child of a vfork this is the shell's memory. */
    char *env[ENV_MAX];
    size_t n = 0, k = 0;
    while (envp && envp[n]) n++;
    if (n + 2 > ENV_MAX) { errno = E2BIG; return -1; }
    if (!is_shell)  /* loaded with nothing to guard: as if it were not */
        return (int)syscall(SYS_execveat, dirfd, path, argv, envp, flags);
    if (getpid() == shell_pid && getenv("TEMPERING_GUARD_EXECED") == NULL) {
        /* The shell execs in its own place for the first time: the program becomes it. */
        for (size_t i = 0; i < n; i++) env[k++] = envp[i];
        env[k++] = "TEMPERING_GUARD_EXECED=1";
        env[k] = NULL;
        mark("pending");
        return (int)syscall(SYS_execveat, dirfd, path, argv, env, flags);
    }
    if (restrict_self() < 0) {
        errno = EPERM;
        return -1;
    }
    close_kept_descriptors();
    char preload[PRELOAD_MAX];
    if (program_env(envp, env, preload, self_path, "TEMPERING_GUARD", NULL) < 0) {
        errno = E2BIG;
        return -1;
    }
    return (int)syscall(SYS_execveat, dirfd, path, argv, env, flags);
}

/* A fork of the shell's that fails is recorded (the verdict is void): a program that filled
 * the sandbox's process limit made the shell's next `$(...)` fail, and bash exit on its own
 * before its later, lower verdict (round forty-five, the fifth red team). */
pid_t fork(void) {
    static pid_t (*real_fork)(void);
    if (real_fork == NULL) real_fork = (pid_t (*)(void))dlsym(RTLD_NEXT, "fork");
    if (real_fork == NULL) { errno = ENOSYS; return -1; }
    pid_t pid = real_fork();
    if (pid < 0 && is_shell && getpid() == shell_pid) {
        int err = errno;
        record("failed", "fork", err);
        errno = err;
    }
    return pid;
}

__attribute__((constructor)) static void start(void) {
    if (getenv("TEMPERING_GUARD_PROBE") != NULL) _exit(landlock_abi() >= 1 ? 97 : 98);
    const char *dir = getenv("TEMPERING_GUARDED");
    if (dir == NULL || dir[0] != '/' || strlen(dir) >= sizeof guarded || strstr(dir, "//")
        || strstr(dir, "/./") || strstr(dir, "/../")) {
        /* No directory to guard: nothing this library should do (and a program that loaded
         * it by its own choice gets nothing from it). */
        return;
    }
    strcpy(guarded, dir);
    size_t n = strlen(guarded);
    if (n > 1 && guarded[n - 1] == '/') guarded[n - 1] = 0;
    is_shell = 1;
    shell_pid = getpid();
    find_self("execguard.so", self_path, sizeof self_path);
    const char *keep_spec = getenv("TEMPERING_GUARD_KEEP");
    if (keep_spec != NULL) keep(keep_spec);
    open_record();
    note_limits();
    if (getenv("TEMPERING_GUARD_EXECED") != NULL) mark("loaded");
}

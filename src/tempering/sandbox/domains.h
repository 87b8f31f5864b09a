/*
 * domains.h: Landlock domains, as the sandbox's C parts take them. Shared by init.c (no write
 * below /proc), execguard.c (no write to the verdict) and nestguard.c (a domain of its own
 * per program), which are compiled separately. Nothing here touches the heap: it runs in the
 * child of a vfork too, which shares its parent's memory.
 */
#ifndef TEMPERING_DOMAINS_H
#define TEMPERING_DOMAINS_H

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef LANDLOCK_ACCESS_FS_REFER
#define LANDLOCK_ACCESS_FS_REFER (1ULL << 13)
#endif
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif
#define SCOPE_SIGNAL (1ULL << 1)

/* landlock_ruleset_attr as of ABI 6 (older headers lack the last two fields); the size given
 * to the kernel is what the running ABI knows (ruleset_size). */
struct ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};

static inline long landlock_abi(void) {
    return syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
}

static inline size_t ruleset_size(long abi) {
    return abi >= 6 ? sizeof(struct ruleset_attr)
         : abi >= 4 ? 2 * sizeof(uint64_t) : sizeof(uint64_t);
}

/* Restrict this thread (and all it starts from now on) to `ruleset`; closes it. */
static inline int enter_domain(int ruleset) {
    int ok = prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
        && syscall(SYS_landlock_restrict_self, ruleset, 0) == 0;
    close(ruleset);
    return ok ? 0 : -1;
}

struct dirent64_ { uint64_t ino; int64_t off; unsigned short reclen; unsigned char type;
                   char name[]; };

/* Grant `rights` (directories) or `file_rights` (anything else) on every entry of directory
 * `dir` but `skip`. An entry that is gone, unreachable or on a filesystem Landlock takes no
 * rule for (EBADFD: nsfs, pipefs) is skipped: it keeps no right. */
static inline int grant_siblings(int ruleset, const char *dir, const char *skip, uint64_t rights,
                                 uint64_t file_rights) {
    int dfd = (int)syscall(SYS_openat, AT_FDCWD, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dfd < 0) return -1;
    char buf[4096], path[1024];
    long n;
    while ((n = syscall(SYS_getdents64, dfd, buf, sizeof buf)) > 0) {
        for (long at = 0; at < n;) {
            struct dirent64_ *e = (struct dirent64_ *)(buf + at);
            at += e->reclen;
            if (!strcmp(e->name, ".") || !strcmp(e->name, "..") || !strcmp(e->name, skip))
                continue;
            snprintf(path, sizeof path, "%s/%s", strcmp(dir, "/") ? dir : "", e->name);
            int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_PATH | O_NOFOLLOW | O_CLOEXEC, 0);
            if (fd < 0) continue;
            struct landlock_path_beneath_attr rule = {
                .allowed_access = e->type == DT_DIR ? rights : file_rights, .parent_fd = fd };
            long added = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                                 &rule, 0);
            if (added < 0 && errno == EINVAL) {  /* not a directory after all, or a link */
                rule.allowed_access = file_rights;
                added = syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                                &rule, 0);
            }
            int err = added < 0 ? errno : 0;
            close(fd);
            if (err != 0 && err != EINVAL && err != EBADFD) {
                close(dfd);
                errno = err;
                return -1;
            }
        }
    }
    close(dfd);
    return n < 0 ? -1 : 0;
}

/* This thread, from now on, in a Landlock domain of its own, nested in the one it was in, in
 * which no file access changes: it handles only making block devices, which no process of a
 * sandbox may do anyway (CAP_MKNOD). What changes is who reaches the process: Landlock lets a
 * process trace another, read or write its memory (/proc/PID/mem) or reopen its descriptors
 * (/proc/PID/fd) only from the same domain or one it is nested in. So two programs that each
 * entered one are out of each other's reach, and their common ancestors reach both. Signals
 * are not scoped: a test's programs stop, check and kill one another (`kill -0 PID`, `pkill`
 * in a cleanup, a program signalling its parent), and a signal only takes a reward away (red
 * team, round fifty-three: scoped, each of those broke). */
static inline int enter_own_domain(void) {
    if (landlock_abi() < 1) return -1;
    struct ruleset_attr attr = { .handled_access_fs = LANDLOCK_ACCESS_FS_MAKE_BLOCK };
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof(uint64_t), 0);
    return ruleset < 0 ? -1 : enter_domain(ruleset);
}

#endif

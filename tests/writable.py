"""What a sandbox's user can write, found by trying: a program to run inside a sandbox.

``WALK`` defines ``walk(own, leave)``, which goes over the whole filesystem but /proc (each
sandbox mounts its own) and tries, in every directory, to create an entry, and every regular
file, to open it for writing. It returns the writable paths in ``own`` (the storage a sandbox
may write), every other writable path (there should be none), and every entry named ``MARK``
found (left by an earlier sandbox that walked with ``leave=True``, which keeps its entries).
"""

from __future__ import annotations

import ast

WALK = '''import os
import stat

MARK = "tempering-left-by-an-earlier-sandbox"


def walk(own, leave):
    writable, marks, stack = [], [], ["/"]
    while stack:
        path = stack.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        probe = os.path.join(path, MARK if leave else MARK + "-probe")
        try:
            os.mkdir(probe)
            if not leave:
                os.rmdir(probe)
            writable.append(path)
        except OSError:
            pass
        for entry in entries:
            if entry.name == MARK:
                marks.append(entry.path)
            try:
                mode = entry.stat(follow_symlinks=False).st_mode  # not d_type: a device
                if stat.S_ISDIR(mode):                            # bound on a file shows
                    if entry.path != "/proc" and entry.name != MARK:  # as a file there
                        stack.append(entry.path)
                elif stat.S_ISREG(mode):
                    os.close(os.open(entry.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW))
                    writable.append(entry.path)
            except OSError:
                pass
    inside = tuple(p + "/" for p in own)
    return {"own": sorted(p for p in writable if p in own),
            "others": sorted(p for p in writable if p not in own and not p.startswith(inside))[:8],
            "marks": sorted(marks)[:8]}
'''


def parse(text: str) -> dict[str, list[str]]:
    """What ``walk`` returned, from the last line of ``text`` (its repr, maybe after a prefix
    such as ``AssertionError: ``)."""
    last = text.strip().splitlines()[-1]
    found: dict[str, list[str]] = ast.literal_eval(last[last.index("{"):])
    return found

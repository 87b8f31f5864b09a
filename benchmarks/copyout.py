"""Reading an agent's workspace out of its sandbox, as grading does, beside its baseline.

    .venv/bin/python benchmarks/copyout.py [--quick] [--backend local] [--storage volume]

An ordinary workspace (200 files of 2 KiB in 20 directories) is read with
``read_sandbox_tree`` (bounded, straight into memory: ``sandbox/copyout.py``), alternating
with the baseline: the same files copied to a host scratch directory with ``download`` and read
back from there (how grading read a workspace before the copy was bounded while read). The
ratio is the figure to compare across machines; ``--quick`` takes 15 runs each instead of 40.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from tempering.sandbox import SandboxSpec, open_sandbox
from tempering.tasks.files import FileTree, read_sandbox_tree

MAKE = ("python3 -c \"import os\nfor d in range(10):\n os.makedirs(f'pkg{d}/sub', exist_ok=True)"
        "\n for i in range(20):\n  p = f'pkg{d}/sub/m{i}.py' if i % 2 else f'pkg{d}/m{i}.py'"
        "\n  open(p, 'w').write('x = 1\\n' * 300)\"")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backend", default="local")
    parser.add_argument("--storage", default="auto")
    args = parser.parse_args()
    runs = 15 if args.quick else 40
    spec = SandboxSpec(backend=args.backend, storage=args.storage)
    bounded: list[float] = []
    baseline: list[float] = []
    async with open_sandbox(spec) as sb:
        r = await sb.exec(MAKE)
        assert r.exit_code == 0, r.stderr
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                tree = await read_sandbox_tree(sb)
                bounded.append(time.perf_counter() - start)
                start = time.perf_counter()
                await sb.download(".", Path(tmp, "w"))
                copied = await asyncio.to_thread(FileTree.read, Path(tmp, "w"))
                baseline.append(time.perf_counter() - start)
            assert len(tree) == len(copied) == 200, (len(tree), len(copied))
    ours, base = statistics.median(bounded), statistics.median(baseline)
    print(f"read_sandbox_tree, 200 files ({args.backend}, {sb.spec.storage}): "
          f"median {ours * 1e3:.2f} ms; baseline (download to host, read back) "
          f"{base * 1e3:.2f} ms; ratio {ours / base:.2f}")


if __name__ == "__main__":
    asyncio.run(main())

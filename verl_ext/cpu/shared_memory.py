"""Remove the POSIX shared-memory segments a finished CPU run left behind in ``/dev/shm``.

vLLM's engine processes exchange requests through ``multiprocessing.shared_memory`` segments (``psm_*``: its
message queues, 160 and 240 MiB of sparse files on this machine) and unlink them when they shut down cleanly. In a
Ray job they are killed with their actor instead, so every vLLM run would leave its segments in ``/dev/shm``
(memory, on tmpfs). The launcher (``run_scripts/tiny_cpu.sh``) takes a :func:`snapshot` before the run and calls
:func:`clean` after it: a segment is removed only if it appeared during the run *and* no process has it open or
mapped, so another run's live segments are never touched::

    python -m verl_ext.cpu.shared_memory snapshot FILE   # before
    python -m verl_ext.cpu.shared_memory clean FILE      # after: removes and names the orphans
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

SHM_DIR = "/dev/shm"
PREFIX = "psm_"


def segments(shm_dir: str = SHM_DIR) -> set[str]:
    """Paths of the ``psm_*`` segments in ``shm_dir``."""
    return set(glob.glob(os.path.join(shm_dir, PREFIX + "*")))


def in_use(paths: set[str], proc: str = "/proc") -> set[str]:
    """Those of ``paths`` some process has open (``/proc/<pid>/fd``) or mapped (``/proc/<pid>/maps``)."""
    used: set[str] = set()
    if not paths:
        return used
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(os.path.join(proc, pid, "maps")) as f:
                maps = f.read()
            used.update(p for p in paths if p in maps)
            fd_dir = os.path.join(proc, pid, "fd")
            for fd in os.listdir(fd_dir):
                target = os.readlink(os.path.join(fd_dir, fd))
                if target in paths:
                    used.add(target)
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    return used


def unused(paths: set[str], proc: str = "/proc") -> set[str]:
    """Those of ``paths`` no process has open or mapped: a finished run's orphans, never another run's live ones."""
    return paths - in_use(paths, proc)


def snapshot(path: str, shm_dir: str = SHM_DIR) -> None:
    with open(path, "w") as f:
        f.write("".join(f"{p}\n" for p in sorted(segments(shm_dir))))


def clean(path: str, shm_dir: str = SHM_DIR, proc: str = "/proc") -> list[str]:
    """Remove the segments that appeared since :func:`snapshot` wrote ``path`` and are unused; returns them."""
    with open(path) as f:
        before = {line.strip() for line in f if line.strip()}
    new = segments(shm_dir) - before
    orphans = sorted(unused(new, proc))
    for p in orphans:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    return orphans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("snapshot", "clean"))
    parser.add_argument("file", help="the snapshot file")
    args = parser.parse_args(argv)
    if args.action == "snapshot":
        snapshot(args.file)
        return 0
    removed = clean(args.file)
    if removed:
        print(
            f"[cpu] removed {len(removed)} shared-memory segment(s) the run left in {SHM_DIR}: "
            + ", ".join(os.path.basename(p) for p in removed)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

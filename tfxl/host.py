"""The machine a tool runs on, as the memory checks read it (the training plan, tfxl-eval,
tfxl-classify-eval)."""

import os
import resource


def host_memory_bytes():
    """The host's physical memory, or the container's cgroup limit when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            total = min(total, int(limit))
    return total


def resident_bytes():
    """This process's peak resident memory so far: what the plans count as the runtime (the
    libraries, the input pipeline) before a step has run.

    Linux's VmHWM, the high-water mark of this program's own address space. Not `ru_maxrss`:
    Linux carries that across fork and exec, so a process started by a large one (a launcher, a
    notebook, a test runner) would start at its parent's size."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

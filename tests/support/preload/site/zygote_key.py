"""What a process must share with a zygote for a fork of the zygote to behave as the process would (compared
by :mod:`sitecustomize` before a hand-off; written by :mod:`zygote` as ``key.json``).

Everything fixed at an interpreter's start or at a preloaded library's load: the interpreter, its flags, the
environment variables read then (:data:`IMPORT_TIME_PREFIXES`; Python's own but ``PYTHONUNBUFFERED``, which the
child applies itself), the namespaces, user, groups and resource limits.
"""

from __future__ import annotations

import os
import resource
import sys

IMPORT_TIME_PREFIXES = ("OMP_", "GOMP_", "MKL_", "OPENBLAS_", "NUMBA_", "TORCH_", "PYTORCH", "CUDA", "THP_",
                        "LD_", "MALLOC_", "GLIBC_", "LC_", "LANG", "TZ", "NPY_", "PYTHON", "TMPDIR")
"""Variables read when the preloaded libraries load (:data:`zygote.PRELOADED`): libgomp's (torch's OpenMP; the
CPU wheel has no Intel OpenMP, so ``KMP_*`` is not read), OpenBLAS's, numba's, torch's own (``TORCH_*``,
``THP_MEM_ALLOC_ENABLE``, not
``TORCHINDUCTOR_*``: the compiler's modules are not preloaded, a child reads those when it imports them),
glibc's, the locale's and Python's."""
APPLIED_BY_CHILD = ("PYTHONUNBUFFERED",)
NAMESPACES = ("net", "mnt", "pid", "ipc", "uts", "user", "cgroup")


def process_key() -> dict:
    flags = {name: getattr(sys.flags, name) for name in dir(sys.flags)
             if not name.startswith(("_", "n_")) and name not in ("count", "index", "unbuffered")}
    environment = {name: value for name, value in os.environ.items()
                   if name.startswith(IMPORT_TIME_PREFIXES) and name not in APPLIED_BY_CHILD}
    limits = {name: list(resource.getrlimit(getattr(resource, name)))
              for name in dir(resource) if name.startswith("RLIMIT_")}
    namespaces = {}
    for name in NAMESPACES:
        try:
            namespaces[name] = os.stat(f"/proc/self/ns/{name}").st_ino
        except OSError:
            namespaces[name] = None
    return {"executable": os.path.realpath(sys.executable), "version": sys.version, "prefix": sys.prefix, "flags": flags,
            "warnoptions": list(sys.warnoptions), "xoptions": {k: str(v) for k, v in sys._xoptions.items()},
            "environment": environment, "limits": limits, "namespaces": namespaces,
            "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups())]}

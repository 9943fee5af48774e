"""Compiling and loading the CPU kernel (``rotary.c``), once per machine.

The shared library is built on first use with the C compiler in ``CC`` (default ``cc``) and kept
in a cache folder (``ROPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/rope``, else ``~/.cache/rope``)
under a name derived from the source, the flags, the compiler and the CPU, so that a changed
source or another machine gets its own build. It is compiled for the CPU it runs on
(``-march=native``, where the compiler takes it) with ``-ffp-contract=off``: no fused
multiply-add, so every product and sum is rounded as the torch operations round them. Its
threads are torch's own: it is built with OpenMP and linked against the OpenMP runtime torch has
loaded (found among the process's mapped libraries), so a call hands its rows to the threads that
torch's operations use, rather than to a second pool competing with them while they wait for
work; where none is found (or the compiler has no OpenMP) it is built without, one thread. Processes
that build at the same time each write a file of their own and rename it into place.

``ROPE_CPU_KERNEL=0`` switches the kernel off; a failed build is not retried in the same process.
Either way :mod:`rope.rotation` takes its torch operations instead, and
:func:`unavailable_reason` says why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

SOURCE = Path(__file__).with_name("rotary.c")
FLAGS = ("-O3", "-std=c99", "-ffp-contract=off", "-fPIC", "-shared")
TUNED = ("-march=native",)  # dropped where the compiler refuses it
OPENMP = ("-fopenmp",)  # with torch's runtime (openmp_runtime); dropped where that fails

_lock = threading.Lock()
_state: dict = {}  # "library" (a ctypes.CDLL or None) and "reason" once decided


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, building it first if needed; ``None`` where it is switched off
    or cannot be built (:func:`unavailable_reason` says why)."""
    if "library" not in _state:
        with _lock:
            if "library" not in _state:
                _state["library"], _state["reason"] = load()
    return _state["library"]


def unavailable_reason() -> str | None:
    """Why :func:`library` is ``None`` (``None`` when the kernel is loaded)."""
    library()
    return _state["reason"]


def cache_dir() -> Path:
    """Where built libraries are kept (see the module docstring)."""
    if os.environ.get("ROPE_CACHE_DIR"):
        return Path(os.environ["ROPE_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rope"


def load() -> tuple[ctypes.CDLL | None, str | None]:
    """Build (where not cached) and load the kernel as the environment now says, uncached:
    ``(library, None)``, or ``(None, reason)``."""
    if os.environ.get("ROPE_CPU_KERNEL", "1") == "0":
        return None, "switched off by ROPE_CPU_KERNEL=0"
    compiler = shutil.which(os.environ.get("CC") or "cc")
    if compiler is None:
        return None, f"no C compiler found (CC={os.environ.get('CC') or 'cc'})"
    source = SOURCE.read_bytes()
    runtime = openmp_runtime()
    link = ("-Wl,--as-needed", runtime, f"-Wl,-rpath,{Path(runtime).parent}") if runtime else ()
    errors = []
    for flags in ((FLAGS + TUNED + OPENMP + link) if runtime else None, FLAGS + TUNED, FLAGS):
        if flags is None:
            continue
        target = cache_dir() / f"rotary-{_build_key(source, compiler, flags)}.so"
        if not target.exists():
            error = _compile(compiler, flags, target)
            if error:
                errors.append(error)
                continue
        try:
            return _declare(ctypes.CDLL(str(target))), None
        except OSError as err:
            errors.append(f"cannot load {target}: {err}")
    return None, "the CPU kernel did not build: " + " / ".join(errors)


def openmp_runtime() -> str | None:
    """The path of the OpenMP runtime (GNU libgomp, Intel's libiomp5 or LLVM's libomp) that torch
    has loaded into this process, from the list of mapped files (Linux); ``None`` where there is
    none or no such list."""
    import torch  # noqa: F401  (loads torch's runtime, if it has one)

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if re.search(r"/lib(gomp|iomp5|omp)\b[^/]*\.so", path) and os.path.exists(path):
            return path
    return None


def _build_key(source: bytes, compiler: str, flags: tuple) -> str:
    """A digest of what the built library depends on: source, compiler, flags and (for
    ``-march=native``) the CPU's features."""
    cpu = platform.machine()
    if TUNED[0] in flags:
        cpu += _cpu_features()
    parts = [source, compiler.encode(), " ".join(flags).encode(), cpu.encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


def _cpu_features() -> str:
    """The CPU's model and feature flags where the system lists them (Linux), else its name."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return "".join(sorted({line for line in lines if line.startswith(("model name", "flags", "Features"))}))


def _compile(compiler: str, flags: tuple, target: Path) -> str | None:
    """Build ``target``; the compiler's complaint, or ``None`` on success."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(handle)
    except OSError as err:
        return f"cannot write to {target.parent} (set ROPE_CACHE_DIR to a writable folder): {err}"
    try:
        options = [f for f in flags if not f.startswith("-Wl,") and not f.endswith(".so") and ".so." not in f]
        libraries = [f for f in flags if f not in options]  # after the source: what it links against
        done = subprocess.run([compiler, *options, "-o", partial, str(SOURCE), *libraries], capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            return f"{compiler} {' '.join(flags)}: {done.stderr.strip()[:500]}"
        os.replace(partial, target)  # atomic: a concurrent build replaces it with the same bytes
        return None
    except (OSError, subprocess.SubprocessError) as err:
        return f"{compiler}: {err}"
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Give the kernel's entry points their C signatures."""
    pointer, int64 = ctypes.c_void_p, ctypes.c_int64
    lib.rope_rotate.restype = ctypes.c_int
    lib.rope_rotate.argtypes = [pointer, pointer, pointer, pointer, pointer, pointer, pointer, int64, int64,
                                ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.rope_rotate_few.restype = ctypes.c_int
    lib.rope_rotate_few.argtypes = [pointer, int64, pointer, ctypes.c_double, ctypes.c_double,
                                    pointer, pointer, pointer, pointer, pointer, pointer, pointer, pointer,
                                    int64, int64, ctypes.c_int, ctypes.c_int]
    return lib

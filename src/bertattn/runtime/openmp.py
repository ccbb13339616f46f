"""Giving back the calling thread's OpenMP threads (torch's intra-op pool on the CPU).

GNU OpenMP (the ``libgomp`` that torch's Linux wheels bundle) keeps a pool of worker threads
for each thread that has run a parallel region, and its workers spin between regions only while
the process's OpenMP threads do not outnumber the CPUs. A server loads its model on the main
thread (a pool of its own) and computes on a worker thread (a second pool): on a 2-core machine
that is more threads than CPUs, so every region wakes sleeping threads instead of spinning ones,
and the model step ran about twice as slow as in a plain process (a one-query embedding 8.6 ms
against 4.3 ms; GELU on a (64, 384) tensor 5x slower). Freeing the main thread's pool once the
model is loaded (``omp_pause_resource_all``, OpenMP 5.0) gives the worker its full speed back; the
pool is made again, harmlessly, if the main thread runs a parallel region later.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import logging
import os

logger = logging.getLogger("bertattn.runtime.threads")

__all__ = ["release_openmp_threads"]

_OMP_PAUSE_HARD = 2  # omp_pause_resource_t: omp_pause_soft = 1, omp_pause_hard = 2


def _runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime torch uses (bundled with torch, else the system's), or None."""
    try:
        import torch
    except ImportError:
        return None
    here = os.path.join(os.path.dirname(torch.__file__), "lib")
    names = sorted(glob.glob(os.path.join(here, "libgomp*.so*")))
    names += sorted(glob.glob(os.path.join(here, "libiomp5*.so*")))
    system = ctypes.util.find_library("gomp")
    for name in [*names, *([system] if system else [])]:
        try:
            lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)  # already loaded only
        except OSError:
            continue
        if hasattr(lib, "omp_pause_resource_all"):
            return lib
    return None


def release_openmp_threads() -> bool:
    """Free the OpenMP worker threads of the calling thread (see the module docstring); True
    when the runtime did. Harmless anywhere: inside a parallel region, with another runtime or
    none, it does nothing and says so at DEBUG level."""
    lib = _runtime()
    if lib is None:
        logger.debug("no OpenMP runtime with omp_pause_resource_all: threads kept")
        return False
    lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
    lib.omp_pause_resource_all.restype = ctypes.c_int
    done = lib.omp_pause_resource_all(_OMP_PAUSE_HARD) == 0
    logger.debug("OpenMP threads of this thread %s", "freed" if done else "kept (runtime said no)")
    return done

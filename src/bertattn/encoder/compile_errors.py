"""Why a torch.compile'd path could not run, in one sentence a user can act on.

torch.compile wraps what went wrong (``BackendCompilerFailed`` around the real error, chained
through ``inner_exception`` / ``__cause__`` / ``__context__``). :func:`explain_failure` looks
through the chain: a missing C++ compiler (inductor's CPU backend needs one) is named only when
that is the cause, a compiler that ran and failed is quoted, and anything else is reported as
its own type and message. Used by int8's fused kernels and by ``Bert.load(compile=True)``.
"""

from __future__ import annotations

__all__ = ["COMPILERS", "causes", "explain_failure"]

#: the names a C++ compiler's program goes by (a missing one is a FileNotFoundError on it)
COMPILERS = ("c++", "cc", "g++", "gcc", "clang", "clang++", "cl", "cl.exe", "icpx", "icx")


def causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and what it wraps: torch.compile's ``inner_exception``, ``__cause__`` and
    ``__context__``, outermost first (each once)."""
    seen: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 16:
        e = todo.pop(0)
        if any(e is s for s in seen):
            continue
        seen.append(e)
        for nxt in (getattr(e, "inner_exception", None), e.__cause__, e.__context__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return seen


def explain_failure(exc: BaseException, *, what: str, kernels: str, call: str, instead: str) -> str:
    """``"{what} could not run here: ..."``: why compiling ``kernels`` (e.g. "its fused
    kernels") or running ``call`` (e.g. "its first int8 forward") raised ``exc``, ending with
    ``instead`` (what the user can do meanwhile, a sentence without its full stop)."""
    chain = causes(exc)
    for e in chain:
        name = type(e).__name__
        missing = name == "InvalidCxxCompiler" or (
            isinstance(e, FileNotFoundError)
            and str(e.filename or "").rsplit("/", 1)[-1] in COMPILERS
        )
        if missing:
            return (
                f"{what} could not run here: {kernels} are compiled by torch.compile's C++ "
                f"backend, and no working C++ compiler was found ({name}: {e}). Install one "
                f"(g++ or clang++), or {instead}."
            )
        if name == "CppCompileError":
            text = str(e).strip()
            if len(text) > 2000:
                text = text[:2000] + " ..."
            return (
                f"{what} could not run here: torch.compile's C++ backend failed to compile "
                f"{kernels} ({name}: {text}). The compiler ran, and its output says why it "
                f"failed; {instead} meanwhile."
            )
    inner = next((e for e in chain if type(e).__name__ != "BackendCompilerFailed"), exc)
    then = instead[:1].upper() + instead[1:]
    return f"{what} could not run here: {call} raised {type(inner).__name__}: {inner}. {then}."

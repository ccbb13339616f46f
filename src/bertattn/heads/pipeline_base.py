"""What bertattn's pipelines share (:class:`Pipeline`): options set at construction, a call's
own options over them, an unknown option named against the pipeline."""

from __future__ import annotations

from typing import Any

__all__ = ["LOAD_KEYWORDS", "Pipeline"]

#: what ``pipeline(task, model, ...)`` passes to the model's loading (:meth:`bertattn.Bert.load`)
LOAD_KEYWORDS = ("device", "dtype", "threads", "backend")


class Pipeline:
    """What the pipelines share, as transformers' ``Pipeline``: options given at
    construction (``pipeline(task, model, top_k=3)``) are the defaults of every call, a
    call's own options win over them, and an option the pipeline does not take is named
    against the pipeline (``OPTIONS``: the ones it takes)."""

    task = ""
    #: the options of a call, which construction may also set
    OPTIONS: tuple[str, ...] = ()

    def set_defaults(self, options: dict[str, Any]) -> None:
        """Make ``options`` the defaults of every call (checked by name here, by value on
        the first call)."""
        self._check(options, "pipeline")
        self.defaults: dict[str, Any] = dict(options)

    def _check(self, options: dict[str, Any], where: str) -> None:
        unknown = [k for k in options if k not in self.OPTIONS]
        if unknown:
            raise TypeError(
                f"the {self.task} pipeline got an unexpected keyword argument {unknown[0]!r} "
                f"(in {where}(...)); its options are {', '.join(self.OPTIONS)}"
                + (f", and loading takes {', '.join(LOAD_KEYWORDS)}" if where == "pipeline" else "")
                + "."
            )

    def __call__(self, inputs: Any, **options: Any) -> Any:
        """The answers for ``inputs``; ``options``: this call's (see the class)."""
        self._check(options, "the call")
        return self._call(inputs, **{**getattr(self, "defaults", {}), **options})

    def _call(self, inputs: Any, **options: Any) -> Any:
        raise NotImplementedError

"""What sentence-transformers' evaluators write on a model after they run: their metrics, on
``model.model_card_data``. bertattn writes no model card (``save`` keeps the folder's own
README); it keeps the metrics, so that evaluators such as ``CrossEncoderRerankingEvaluator``,
``SparseInformationRetrievalEvaluator`` and ``MultiVectorInformationRetrievalEvaluator`` run on
a bertattn model and their results can be read back."""

from __future__ import annotations

from typing import Any

__all__ = ["EvaluationMetrics"]


class EvaluationMetrics:
    """``model_card_data`` for evaluators: :meth:`set_evaluation_metrics` records each run's
    metrics in :attr:`runs` (``(evaluator name, metrics, epoch, step)``, in order)."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, dict[str, Any], int, int]] = []

    def set_evaluation_metrics(
        self, evaluator: object, metrics: dict[str, Any], epoch: int = 0, step: int = 0
    ) -> None:
        """Keep one evaluator run's metrics (sentence-transformers' call)."""
        name = str(getattr(evaluator, "name", "") or type(evaluator).__name__)
        self.runs.append((name, dict(metrics), int(epoch), int(step)))

    def __repr__(self) -> str:
        return f"EvaluationMetrics({len(self.runs)} runs)"

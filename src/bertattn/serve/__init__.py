"""``bertattn serve``: sentence embeddings over HTTP (needs ``pip install 'bertattn[serve]'``).

    from bertattn import Bert
    from bertattn.serve import create_app
    app = create_app(Bert.load(), max_batch_tokens=8192, api_key="...")  # an ASGI app

Routes: OpenAI's ``POST /v1/embeddings``, Text Embeddings Inference's ``POST /embed`` and
``POST /tokenize``, ``GET /v1/models``, ``GET /info``, the probes ``GET /live`` / ``/ready`` /
``/health``, and ``GET /metrics`` (Prometheus). See docs/serving.md.
"""

from __future__ import annotations

from .app import create_app
from .errors import ApiError
from .limits import Limits
from .state import ServeState

__all__ = ["ApiError", "Limits", "ServeState", "create_app"]

"""The families bertattn loads now live in :mod:`bertattn.families` (one record per
architecture); this module keeps the names other code imported from here."""

from __future__ import annotations

from ..families.bert import roberta_head_name

__all__ = ["roberta_head_name"]

"""`bertattn rerank`: documents ranked for a query by a one-label cross-encoder (options:
:class:`bertattn.jobs.head_options.RerankOptions`, job: :func:`bertattn.jobs.heads.run_rerank`)."""

from . import job_command

add_arguments, run = job_command("rerank")

"""`bertattn predict`: the model's head on every input, as ``bertattn.pipeline`` answers
(options: :class:`bertattn.jobs.head_options.PredictOptions`, job:
:func:`bertattn.jobs.heads.run_predict`)."""

from . import job_command

add_arguments, run = job_command("predict")

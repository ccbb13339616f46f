"""``dtype="auto"`` for :meth:`bertattn.Bert.load` and the command line: the compute dtype that
is fastest on the machine the model runs on, and why.

The rule, from measurements (docs/performance.md):

* a CPU with AMX (the /proc/cpuinfo flag ``amx_bf16``): bfloat16. Its tile units multiply bf16
  matrices natively, and bf16 encodes faster than fp32 there;
* a CPU with AVX512_BF16 but no AMX: float32. bf16 is native there too, yet measured slower
  than fp32 for every engine tried (bertattn 248 vs 357 texts/s, OpenVINO 197 vs 288);
* any other CPU: float32. With no native bf16 matrix product oneDNN emulates it, slower still;
* CUDA: bfloat16 where ``torch.cuda.is_bf16_supported()`` (Ampere and later), else float16;
* any other device: float32 (nothing measured).

This is not what ``BertModel.from_pretrained(..., dtype="auto")`` means: there, as in
transformers, ``"auto"`` is the dtype the checkpoint was saved in (its config.json), and it
stays so, since code written for transformers relies on it. ``Bert`` is bertattn's own entry
point, and there ``"auto"`` asks for the fastest dtype here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cpu import cpu_capability

__all__ = ["DtypeChoice", "choose_dtype"]

#: the reasons, one per branch of the CPU rule (tests and docs quote them)
AMX_WHY = "AMX: bf16 matmuls run on the tile units, measured faster than fp32"
AVX512_BF16_WHY = "AVX512_BF16 without AMX: bf16 measured slower than fp32"
EMULATED_WHY = "no native bf16 matmul: bf16 emulated (slower than fp32)"


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype :func:`choose_dtype` picked (``dtype``) and why (``reason``, one line)."""

    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        """The dtype's name without ``torch.`` (``"bfloat16"``), as the command line spells it."""
        return str(self.dtype).replace("torch.", "")

    def __str__(self) -> str:
        return f"{self.name} ({self.reason})"


def choose_dtype(
    device: str | torch.device = "cpu",
    *,
    cpu_flags: set[str] | None = None,
    cuda_bf16: bool | None = None,
) -> DtypeChoice:
    """The compute dtype ``dtype="auto"`` gives on ``device`` (``"cpu"``, ``"cuda"``,
    ``"cuda:N"``, ``"auto"`` or a torch.device), with its reason; see the module docstring for
    the rule. ``cpu_flags``: the CPU's /proc/cpuinfo flags (default: this machine's);
    ``cuda_bf16``: whether the GPU does bf16 (default: ``torch.cuda.is_bf16_supported()``).
    Both are there so the rule can be checked without the hardware. Nothing is loaded."""
    kind = _device_type(device)
    if kind == "cuda":
        if cuda_bf16 is None:
            cuda_bf16 = bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        if cuda_bf16:
            return DtypeChoice(torch.bfloat16, "CUDA with bf16 support: bfloat16")
        return DtypeChoice(torch.float16, "CUDA without bf16 support: float16")
    if kind != "cpu":
        return DtypeChoice(torch.float32, f"no measured rule for {kind}: float32")
    cap = cpu_capability(cpu_flags)
    if cap["capability"] == "AMX":
        return DtypeChoice(torch.bfloat16, AMX_WHY)
    if cap["bf16_matmul"] == "native":
        return DtypeChoice(torch.float32, AVX512_BF16_WHY)
    return DtypeChoice(torch.float32, EMULATED_WHY)


def _device_type(device: str | torch.device) -> str:
    """``device``'s type; ``"auto"`` is CUDA when there is one. Not checked against the
    machine (:func:`bertattn.bert.device.resolve_device` does that), so the rule for a device
    that is not here can be asked for."""
    if isinstance(device, str) and device.strip().lower() == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        return torch.device(device).type
    except (RuntimeError, TypeError):
        raise ValueError(
            f"device {device!r} is not valid; use 'auto', 'cpu', 'cuda', 'cuda:N' or a "
            f"torch.device."
        ) from None

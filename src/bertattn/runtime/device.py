"""``resolve_device``: a device argument (``"auto"``, ``"cuda:N"``, ...) as a torch.device."""

from __future__ import annotations

import re

import torch

from ..arguments import ArgumentTypeError, is_int

__all__ = ["resolve_device"]

_DEVICE_FORMS = "'auto', 'cpu', 'cuda', 'cuda:N' (N a GPU index) or a torch.device"


def resolve_device(device: str | int | torch.device) -> torch.device:
    """``"auto"`` (CUDA when available, else CPU), ``"cpu"``, ``"cuda"``, ``"cuda:N"``, an int
    (``cuda:N``, NumPy integers too) or a :class:`torch.device` -> a :class:`torch.device`;
    TypeError for another type, ValueError for another string, a negative index, or CUDA
    where there is none."""
    if isinstance(device, torch.device):
        out = device
    elif is_int(device):
        if not 0 <= device < 2**31:  # type: ignore[operator]
            raise ValueError(f"device {device!r} is not a GPU index; use {_DEVICE_FORMS}.")
        out = torch.device("cuda", int(device))  # type: ignore[call-overload]
    elif isinstance(device, str):
        text = device.strip().lower()
        if text == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if not re.fullmatch(r"cpu|cuda(:\d{1,9})?", text):
            raise ValueError(f"device {device!r} is not valid; use {_DEVICE_FORMS}.")
        out = torch.device(text)
    else:
        raise ArgumentTypeError(
            f"device must be a str or a torch.device, got {type(device).__name__} "
            f"{device!r}; use {_DEVICE_FORMS}."
        )
    if out.type == "cuda":
        if not torch.cuda.is_available():
            why = "torch is a CPU-only build" if torch.version.cuda is None else "no GPU is visible"
            raise ValueError(
                f"device {device!r}: CUDA is not available here ({why}); use 'cpu', or 'auto' "
                f"for CUDA when there is one."
            )
        count = torch.cuda.device_count()
        if out.index is not None and out.index >= count:
            raise ValueError(
                f"device {device!r}: this machine has {count} CUDA device(s), cuda:0.."
                f"cuda:{count - 1}."
            )
    return out

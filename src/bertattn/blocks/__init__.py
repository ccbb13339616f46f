"""Small shared layers the architectures in :mod:`bertattn.families` are built from, each
tested against a plain reference: norms, feed-forwards (plain and gated), a pre- or post-norm
block, rotary tables per layer kind, and the encoder stack that runs them padded or packed."""

from .block import EncoderBlock, SandwichBlock
from .contract import EncoderStack, StackInfo
from .embeddings import ScaledTokenEmbeddings, TokenEmbeddings
from .feedforward import FeedForward, GatedFeedForward, activation
from .norms import OffsetRMSNorm, make_norm
from .rotary import LayerKind, RotaryTables
from .stack import RotaryEncoder

__all__ = [
    "EncoderBlock",
    "EncoderStack",
    "FeedForward",
    "GatedFeedForward",
    "LayerKind",
    "OffsetRMSNorm",
    "RotaryEncoder",
    "RotaryTables",
    "SandwichBlock",
    "ScaledTokenEmbeddings",
    "StackInfo",
    "TokenEmbeddings",
    "activation",
    "make_norm",
]

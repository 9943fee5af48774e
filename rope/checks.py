"""Argument checks shared by the modules of ``rope``: each raises an error naming the argument
and what was expected, and nothing is silently converted or clamped."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def head_tensors(**tensors: torch.Tensor) -> None:
    """Raise unless each keyword is a float16/bfloat16/float32/float64 tensor of shape
    ``[batch, seq, heads, head_dim]`` (queries, keys, values)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape [batch, seq, heads, head_dim], got {tuple(t.shape)}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16, float32 or float64, got {t.dtype}")


def tensor(name: str, value) -> torch.Tensor:
    """Raise unless ``value`` is a tensor; return it."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def integer_tensor(name: str, value, *, dim: int | None = None, length: int | None = None) -> torch.Tensor:
    """Raise unless ``value`` is an integer (not bool) tensor, of ``dim`` dimensions and, for a
    1-D tensor, ``length`` entries when those are given; return it."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integers, got {type(value).__name__}")
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {value.dtype}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(value.shape)}")
    if length is not None and value.shape[0] != length:
        raise ValueError(f"{name} has {value.shape[0]} entries, expected {length} (the seq dimension)")
    return value


def int_at_least(name: str, value, minimum: int) -> int:
    """Raise unless ``value`` is an int (not bool) >= ``minimum``; return it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value

"""Argument checks for every public entry point of ``rope``: the package's error policy, in one place.

The policy (README, "Errors"):

* a value of the wrong *type* raises ``TypeError`` naming the argument and the expected type;
  a value of the right type but the wrong *value* (range, shape, NaN/inf, length) raises
  ``ValueError`` naming the argument and what was expected;
* flags are real ``bool`` values: ``"False"``, ``0``, ``None`` or ``numpy.bool_`` are refused,
  since a string would be truthy;
* integers are Python ``int`` or NumPy integers (accepted on purpose: they are integers), never
  ``bool``, floats (``3.0``), strings or lists; they come back as ``int``;
* real numbers are ``int``, ``float`` or NumPy integers and floats, never ``bool``; NaN and
  infinities are refused unless an argument says otherwise; they come back as ``float``;
* nothing is silently converted, clamped, truncated or ignored.

Checks on tensor *values* (finite frequencies, valid M-RoPE axes) would cost a device-to-host
synchronisation on CUDA; there they are asynchronous device assertions
(:func:`assert_values`), raised by the next synchronising call, and eager ``ValueError`` on
every other device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral, Real

import torch

INT64_MAX = 2**63 - 1
"""The largest int64 value: the largest position, and the bound of integer options that reach int64."""

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
"""The dtypes of queries and keys: the floating types rope rotates (one rounding to each)."""


def flag(name: str, value) -> bool:
    """Raise ``TypeError`` unless ``value`` is ``True`` or ``False``; return it."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool (True or False), got {type(value).__name__} {value!r}")
    return value


def integer(name: str, value, *, minimum: int | None = None, maximum: int | None = None,
            even: bool = False) -> int:
    """``value`` as an ``int``: ``TypeError`` unless it is an int or NumPy integer (not bool),
    ``ValueError`` outside ``[minimum, maximum]`` or, with ``even``, when odd."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    if even and value % 2:
        raise ValueError(f"{name} must be even, got {value}")
    return value


def optional_integer(name: str, value, **bounds) -> int | None:
    """``None``, or :func:`integer` of ``value``."""
    return None if value is None else integer(name, value, **bounds)


def number(name: str, value, *, minimum: float | None = None, maximum: float | None = None,
           positive: bool = False, finite: bool = True) -> float:
    """``value`` as a ``float``: ``TypeError`` unless it is a real number (int, float, NumPy
    number; not bool), ``ValueError`` if it is NaN, infinite (unless ``finite=False``), not
    ``> 0`` with ``positive``, or outside ``[minimum, maximum]``. Integers too large for a
    float raise ``ValueError`` (not ``OverflowError``)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{name} is too large for a float, got {value!r}") from None
    if math.isnan(value) or (finite and math.isinf(value)):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def choice(name: str, value, options: Iterable[str]) -> str:
    """Raise ``ValueError`` unless ``value`` is one of ``options``; return it."""
    options = tuple(options)
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, options))}, got {value!r}")
    return value


def dtype_choice(name: str, value, options: Iterable[torch.dtype]) -> torch.dtype:
    """Raise ``TypeError`` unless ``value`` is a ``torch.dtype``, ``ValueError`` unless it is one
    of ``options``; return it."""
    options = tuple(options)
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype, got {type(value).__name__} {value!r}")
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(str(d).removeprefix('torch.') for d in options)}, "
                         f"got {value}")
    return value


def tensor(name: str, value) -> torch.Tensor:
    """Raise ``TypeError`` unless ``value`` is a tensor; return it."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def float_tensor(name: str, value, *, dtypes=FLOAT_DTYPES, dim: int | None = None) -> torch.Tensor:
    """Raise unless ``value`` is a tensor of one of ``dtypes`` (``TypeError``) with ``dim``
    dimensions (``ValueError``); return it."""
    tensor(name, value)
    if value.dtype not in dtypes:
        names = [str(d).removeprefix("torch.") for d in dtypes]
        expected = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        raise TypeError(f"{name} must be {expected}, got {value.dtype}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(value.shape)}")
    return value


def head_tensors(**tensors: torch.Tensor) -> None:
    """Raise unless each keyword is a float16/bfloat16/float32/float64 tensor of shape
    ``[batch, seq, heads, head_dim]`` (queries, keys, values)."""
    for name, t in tensors.items():
        float_tensor(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape [batch, seq, heads, head_dim], got {tuple(t.shape)}")


def integer_tensor(name: str, value, *, dim: int | None = None, length: int | None = None) -> torch.Tensor:
    """Raise unless ``value`` is an integer (not bool) tensor, of ``dim`` dimensions and, for a
    1-D tensor, ``length`` entries when those are given; return it.

    Every integer dtype whose values all fit int64 is taken (int8 .. int64, uint8 .. uint32):
    positions are int64 values and are converted to int64 exactly. ``uint64`` is refused
    (``TypeError``): its values from 2^63 up have no int64 value (a conversion would wrap them to
    m - 2^64, a silently wrong position), and torch supports few operations on it anyway."""
    tensor(name, value)
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {value.dtype}")
    if value.dtype == torch.uint64:
        raise TypeError(f"{name} must be an integer tensor whose values fit int64 (int8 .. int64, uint8 .. uint32), "
                        f"got {value.dtype}")
    if dim is not None and value.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(value.shape)}")
    if length is not None and value.shape[0] != length:
        raise ValueError(f"{name} has {value.shape[0]} entries, expected {length} (the seq dimension)")
    return value


def same_device(reference_name: str, reference: torch.Tensor, **tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` unless every tensor is on ``reference``'s device."""
    for name, t in tensors.items():
        if t.device != reference.device:
            raise ValueError(f"{name} is on {t.device} but {reference_name} is on {reference.device}")


def reads_are_free(device: torch.device) -> bool:
    """Whether code may read a tensor's values on the host at no cost: on the CPU, not while
    torch.compile traces. On other devices a read waits for the device (a synchronisation), which
    no rotation path does; the CPU's faster paths (exact float64 products, the block path's tie
    test) read, and tests switch them off with this function to check the paths of the others.

    Args:
        device: the device of the tensors to be read.
    """
    return device.type == "cpu" and not torch.compiler.is_compiling()


def assert_values(name: str, ok: torch.Tensor, expected: str) -> None:
    """Refuse a tensor whose values break a rule: ``ok`` is a 0-D bool tensor computed from it.
    Eager ``ValueError`` off CUDA; on CUDA, and under ``torch.compile``, an asynchronous device
    assertion (no host synchronisation), which fails the next synchronising call."""
    if torch.compiler.is_compiling() or ok.is_cuda:
        torch._assert_async(ok, f"{name} must hold {expected}")
    elif not bool(ok):
        raise ValueError(f"{name} must hold {expected}")


FREQUENCY_DTYPES = (torch.float32, torch.float64)
"""The dtypes of ``inv_freq`` that the torch path honours exactly (the kernel: float32 only)."""

_FLOAT64_FREQUENCY_RANGE = (2.0**-100, 2.0**127)  # where three float32 pieces hold a float64 exactly


def finite_frequencies(name: str, inv_freq: torch.Tensor, *, dtypes=(torch.float32,),
                       values: bool = True) -> torch.Tensor:
    """Raise unless ``inv_freq`` is a 1-D tensor of ``dtypes`` with finite values (zeros are
    legal: proportional RoPE pads with them); return it.

    The rule for the frequencies' dtype: rope rotates by exactly the theta_i it is given and
    never rounds them. float32 (what :func:`rope.inv_freq` returns and transformers computes) is
    taken everywhere. float64 is honoured exactly by the torch path (``dtypes`` includes it;
    nonzero |theta_i| must then lie in [2^-100, 2^127], where three float32 pieces hold it
    exactly) and refused by the kernel, which :func:`rope.apply_rotary` then does not pick.
    float16 and bfloat16 are refused: such a buffer is usually the mistake of transformers issue
    #29496 (a model cast rounds its frequencies); recompute it in float32. ``values=False``
    checks the metadata only, for a caller whose values are checked further down (the kernel's
    operators check them again).
    """
    float_tensor(name, inv_freq, dtypes=dtypes, dim=1)
    if values:
        frequency_values(name, inv_freq)
    return inv_freq


def frequency_values(name: str, inv_freq: torch.Tensor) -> None:
    """The value half of :func:`finite_frequencies`, for frequencies whose dtype and shape are
    checked: finite, and float64 ones of magnitude 0 or in [2^-100, 2^127)."""
    if not inv_freq.numel():
        return
    if reads_are_free(inv_freq.device):  # one reduction: a float64 sum is finite iff every value is
        if not math.isfinite(inv_freq.sum(dtype=torch.float64)):
            raise ValueError(f"{name} must hold finite values (no NaN or inf)")
    else:
        assert_values(name, torch.isfinite(inv_freq).all(), "finite values (no NaN or inf)")
    if inv_freq.dtype == torch.float64:
        size = inv_freq.abs()
        low, high = _FLOAT64_FREQUENCY_RANGE
        assert_values(name, ((size == 0) | ((size >= low) & (size < high))).all(),
                      "float64 values of magnitude 0 or in [2^-100, 2^127)")


def first_line(err: BaseException, width: int) -> str:
    """The first line of an error's message, cut at a word boundary to ``width`` characters (with
    " ..." where cut): how a reason quotes an error it caught."""
    lines = str(err).strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= width else line[:width].rsplit(" ", 1)[0] + " ..."

"""Hypothesis strategies shared by the suite (``from strategies import layouts, seeds``).

A strategy used by one test file stays in that file; one with the same job in two files lives here.
"""

import torch
from hypothesis import strategies as st

import rope
from helpers import FLOAT_DTYPES

seeds = st.integers(0, 2**31 - 1)
"""A seed for ``torch.Generator().manual_seed`` or ``numpy.random.default_rng``."""

layouts = st.sampled_from(["half", "interleaved"])
"""The two pairings of coordinates (rope.layouts): (i, i + d/2) and (2i, 2i + 1)."""

dtypes = st.sampled_from(FLOAT_DTYPES)
"""float16, bfloat16, float32, float64."""

half_dims = st.integers(1, 12)
"""d/2, the pairs of a small head: enough for the analysis functions' loops to stay fast."""

bases = st.floats(2.0, 1e6)
"""rope_theta, from barely above 1 to the bases of long-context models."""


def frequencies(rotary_dim: int, low: float = 10.0, high: float = 1e6) -> st.SearchStrategy[torch.Tensor]:
    """float32 theta_i of the default rope_type, ``rotary_dim // 2`` of them, for a base in [low, high]."""
    return st.floats(low, high).map(lambda base: rope.inv_freq({"rope_theta": base}, rotary_dim)[0])


@st.composite
def position_ids(draw, batch: int, seq: int, highs=(64, 2**16, 2**31 - 1), signed: bool = False) -> torch.Tensor:
    """int64 positions, [seq] (shared by the batch) or [batch, seq], in [0, high) or (-high, high) for
    ``signed``, high drawn from ``highs``."""
    gen = torch.Generator().manual_seed(draw(seeds))
    high = draw(st.sampled_from(highs))
    shape = (seq,) if draw(st.booleans()) else (batch, seq)
    return torch.randint(-high + 1 if signed else 0, high, shape, generator=gen)

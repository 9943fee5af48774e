"""What the book derives and measures; not needed to use RoPE (``import rope`` does not load it).

* :mod:`.decay` — the long-term decay bound and the base needed for a context length;
* :mod:`.precision` — the usual float32 recipe, bf16 tables and position-digit tables;
* :mod:`.scaling` — what frequency scaling does to each pair: NTK bases, YaRN ramps, temperatures;
* :mod:`.extrapolation` — unseen angles and the interpolation bounds of length extension;
* :mod:`.general` — the general rotations exp(nB) and O^n, and block-diagonalizing B;
* :mod:`.notebook` — chapters whose cells need Triton or transformers skip them without it;
* :mod:`.book` — what every chapter uses: its start (seeds, figure style), tables, ``glue``.
"""

from . import book, decay, extrapolation, general, notebook, precision, scaling

__all__ = ["book", "decay", "extrapolation", "general", "notebook", "precision", "scaling"]

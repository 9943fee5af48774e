"""Audio placeholders in a probe's token ids, for models that place their audio features by them.

MusicFlamingo's forward (``modeling_musicflamingo.py``) puts the projected audio features in
place of its ``audio_token_id`` tokens and builds each window's timestamps from the runs of
those tokens (one run per audio sample, its windows in order): its token ids must hold as many
audio tokens as its encoder gives output frames. :func:`with_placeholders` writes them into the
probe's ids (:func:`rope.hf.feeds.run`): all windows as one sample, one run in the first row
after two text tokens, so that every window but the first has a nonzero window index (the
window axis of its rotary time module turns too).
"""

from __future__ import annotations

import torch
from torch import nn

PLACEHOLDER_TYPES = ("musicflamingo",)
"""The model types whose feeds get audio placeholders."""

LEAD = 2
"""Text tokens before the run of audio tokens."""


def with_placeholders(module: nn.Module, kwargs: dict) -> dict:
    """``kwargs`` with the run of audio tokens in ``input_ids`` where ``module`` (a model of
    :data:`PLACEHOLDER_TYPES`) is given ``input_features`` and ``input_features_mask``; else
    ``kwargs`` as they are. Raises ``ValueError`` where the run does not fit in the first row.

    Args:
        module: the module the feed runs.
        kwargs: the forward's arguments.
    """
    config = getattr(module, "config", None)
    needed = ("input_ids", "input_features", "input_features_mask")
    if getattr(config, "model_type", None) not in PLACEHOLDER_TYPES or not all(
            isinstance(kwargs.get(key), torch.Tensor) for key in needed):
        return kwargs
    tower = next(m for m in module.modules() if callable(getattr(m, "_get_feat_extract_output_lengths", None)))
    _, frames = tower._get_feat_extract_output_lengths(kwargs["input_features_mask"].sum(-1).to(torch.long))
    count = int(frames.sum())
    ids = kwargs["input_ids"].clone()
    if LEAD + count > ids.shape[-1]:
        raise ValueError(f"input_ids: {count} audio tokens (the encoder's output frames) do not fit in a row of "
                         f"{ids.shape[-1]} after {LEAD} text tokens")
    ids[0, LEAD:LEAD + count] = config.audio_token_id
    return {**kwargs, "input_ids": ids}

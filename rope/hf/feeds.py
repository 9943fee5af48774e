"""How a probe runs a tiny model (:mod:`rope.hf.coverage`): which submodule's forward it calls,
with what inputs, and at which positions.

A :class:`Feed` names the submodule run (``part``; ``""``: the model), the forward's argument the
sequence goes in (``input_ids``, ``inputs_embeds``, ``input_features``, ``input_values``, ...)
with its shape, and any other argument the forward requires (an encoder's hidden states, a
decoder's ids), or a builder of them all (inputs no name and shape tell: EsmFold2's complex,
:mod:`rope.hf.part_feeds`). :func:`run` calls it: token ids are the ones given (or, for another shape, drawn
in the tokens' range from a generator seeded by them), float inputs standard normal from a
generator seeded by the token ids, so the same tokens give the same inputs. The positions are
``offset, offset + 1, ...``: passed as ``position_ids`` where the forward takes them for a
sequence of tokens or embeddings, else added to the position ids every ``rotary_emb`` module and
every vision rotary module receives (:func:`shifted_rotary_positions`, a forward pre-hook), which
moves the rotary angles and nothing else. A vision tower is fed one image of :data:`GRID`
patches: as pixels, or as its patches flattened (the patch embedding's input: channels x frames
x side^2), or as squares of merged patches (then its grid counts merged tokens), with its grid
(``grid_thw``, ``image_sizes``, the patches' positions) where its forward takes one. No cache is
built (``use_cache=False`` where the forward takes it). :func:`candidates` lists the feeds a
probe tries, in order, from the forwards' signatures and the parts' configs.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from . import audio_feeds
from .clvp import RotaryAngleTable
from .self_rotating import is_stacked_rotary
from .vision import is_vision_rotary


@dataclass(frozen=True)
class Feed:
    """One way to run a model: ``part(argument=<shape>, **<extra>)``.

    Args:
        part: the qualified name of the submodule whose forward runs (``""``: the model's).
        argument: the forward's argument that holds the sequence.
        shape: its shape (``()``: the token ids given, as they are).
        extra: other arguments the forward requires, ``(name, shape)`` each: integer ids where
            the name ends in ``_ids`` (``()``: the token ids given) or ``_code`` (codec codes),
            ones where it ends in ``_mask``, a count where it starts with ``num_`` (the shape's
            first number; where the shape is ``()``, half the sequence: image patches, frames),
            an image's grid where it ends in ``_thw`` or ``image_sizes`` (one row: the shape's
            numbers, :data:`GRID` patches or their pixels), the merge size per image
            where it ends in ``merge_sizes`` and each audio chunk's waveform samples where it ends
            in ``sample_lengths`` (the shape's numbers), the patches' (row, column) where it ends
            in ``position_ids`` with a last dimension of 2, each position's patch where it is
            ``patch_ids`` (patches of :data:`PATCH` positions in order: ``position // PATCH``),
            else float.
        build: where not ``""``, the name of a builder of :data:`BUILDERS` (those of
            :mod:`rope.hf.part_feeds`) that makes the forward's arguments from the part, the feed
            and the tokens, in place of the rules above: inputs no name and shape tell (a
            dataclass of tensors, indices that must agree with each other: EsmFold2's featurized
            complex).
    """

    part: str = ""
    argument: str = "input_ids"
    shape: tuple[int, ...] = ()
    extra: tuple[tuple[str, tuple[int, ...]], ...] = ()
    build: str = ""

    def describe(self) -> str:
        """``part.forward(argument[shape], ...)``, for reasons and reports."""
        args = [f"{name}{list(shape) if shape else ''}" for name, shape in ((self.argument, self.shape), *self.extra)]
        return f"{self.part or 'the model'}({', '.join(args)})"


BUILDERS: dict[str, Callable] = {}
"""The builders a :class:`Feed` may name (``build``), by name: each registered by :func:`builder`
where it is defined (:mod:`rope.hf.part_feeds`, which imports this module)."""


def builder(function: Callable) -> Callable:
    """Register ``function(module, feed, tokens) -> kwargs`` in :data:`BUILDERS` under its name."""
    BUILDERS[function.__name__] = function
    return function


def _value(name: str, shape: tuple[int, ...], tokens: torch.Tensor, index: int) -> torch.Tensor | int:
    """An input: the token ids, ids of another shape in their range, or floats, seeded by the tokens."""
    if name.endswith("_ids") and not shape:
        return tokens
    if name.endswith("_mask"):
        return torch.ones(shape, dtype=torch.long)
    if name.startswith("num_"):
        return shape[0] if shape else LENGTH // 2
    if name.endswith(GRID_NAMES):
        return torch.tensor([shape])
    if name.endswith(("merge_sizes", "sample_lengths")):
        return torch.tensor(shape)
    if name == "patch_ids":
        return (torch.arange(shape[-1]) // PATCH).expand(shape)
    if name.endswith("position_ids") and shape and shape[-1] == 2:
        rows, columns = torch.meshgrid(torch.arange(GRID[1]), torch.arange(GRID[2]), indexing="ij")
        return torch.stack((rows.flatten(), columns.flatten()), dim=-1).expand(shape)
    generator = torch.Generator().manual_seed(int(tokens.sum()) * 7 + index)
    if name.endswith(("_ids", "_code")):
        return torch.randint(int(tokens.min()), int(tokens.max()) + 1, shape, generator=generator)
    return torch.randn(shape, generator=generator)


def _parameters(module: nn.Module) -> dict[str, inspect.Parameter]:
    return {name: p for name, p in inspect.signature(module.forward).parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def takes_positions(module: nn.Module, feed: Feed) -> bool:
    """Whether ``feed`` passes the positions as ``position_ids``: the forward takes them, and its
    sequence is the tokens' or embeddings' (not audio frames a convolution subsamples), with no
    second sequence (a decoder's) beside it, and no rotary module that numbers the sequence itself
    (``forward(hidden_states)``: CLVP's, whose table holds the sequence's positions only, so that
    position ids moved past it fall outside)."""
    return ("position_ids" in _parameters(module) and feed.argument in ("input_ids", "inputs_embeds")
            and not any(name.startswith("decoder_") for name, _ in feed.extra)
            and not any(is_stacked_rotary(m) or isinstance(m, RotaryAngleTable) for m in module.modules()))


def run(model: nn.Module, feed: Feed, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """The output of ``feed`` on ``model`` (:func:`first_output`), seeded by ``tokens``, at
    positions ``offset, offset + 1, ...``."""
    module = model.get_submodule(feed.part) if feed.part else model
    if feed.build:
        if feed.build not in BUILDERS:
            raise ValueError(f"build: no feed builder is named {feed.build!r} (rope.hf.feeds.BUILDERS: "
                             f"{', '.join(sorted(BUILDERS)) or 'none; rope.hf.part_feeds registers them'})")
        kwargs = BUILDERS[feed.build](module, feed, tokens)
    else:
        kwargs = {feed.argument: _value(feed.argument, feed.shape, tokens, 0)}
        kwargs.update((name, _value(name, shape, tokens, i + 1)) for i, (name, shape) in enumerate(feed.extra))
    main = kwargs[feed.argument]
    kwargs = audio_feeds.with_placeholders(module, kwargs)  # MusicFlamingo: audio tokens where its features go
    if "use_cache" in _parameters(module):
        kwargs["use_cache"] = False  # one forward: a cache changes nothing, and some configs cannot size one
    shift = contextlib.nullcontext()
    if takes_positions(module, feed):
        kwargs["position_ids"] = torch.arange(main.shape[1])[None].expand(main.shape[0], -1) + offset
    elif offset:
        shift = shifted_rotary_positions(model, offset)
    with torch.no_grad(), shift:
        return first_output(module(**kwargs))


def first_output(out) -> torch.Tensor:
    """The logits, else the last hidden state, else the last of the hidden states where the output
    holds them (LightGlue's, whose other outputs are its detector's keypoints and thresholded
    match scores), else the largest floating tensor of a forward's
    output (a codec's waveform, a patcher's logits beside its entropies), else the first floating
    tensor of its first tuple (a backbone's feature maps: EfficientLoFTR's coarse features, its
    transformer's output, come first)."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    hidden = getattr(out, "hidden_states", None)  # a keypoint matcher's: its last layer's output
    if isinstance(hidden, tuple) and hidden and isinstance(hidden[-1], torch.Tensor) and hidden[-1].is_floating_point():
        return hidden[-1]
    values = out.to_tuple() if hasattr(out, "to_tuple") else out if isinstance(out, (tuple, list)) else (out,)
    found = [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]
    nested = next((v for v in values if isinstance(v, (tuple, list))), ())
    if not found and any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in nested):
        return next(v for v in nested if isinstance(v, torch.Tensor) and v.is_floating_point())
    if not found:
        raise TypeError(f"its output ({type(out).__name__}) holds no floating tensor")
    return max(found, key=torch.Tensor.numel)


def rotary_modules(model: nn.Module) -> list[nn.Module]:
    """Every module held as ``rotary_emb`` in ``model`` and every vision rotary module
    (:func:`rope.hf.vision.is_vision_rotary`; transformers' or rope's), each once."""
    found = {}
    for m in model.modules():
        held = getattr(m, "rotary_emb", None)
        if isinstance(held, nn.Module):
            found.setdefault(id(held), held)
        if is_vision_rotary(m):
            found.setdefault(id(m), m)
    return list(found.values())


@contextlib.contextmanager
def shifted_rotary_positions(model: nn.Module, offset: int) -> Iterator[None]:
    """Within the context, every rotary module of ``model`` (:func:`rotary_modules`) sees its
    integer position ids (its second argument, or ``position_ids``) moved by ``offset``: a vision
    module's on every axis, which moves the image and keeps its patches' relative positions."""
    def hook(module, args, kwargs):
        if len(args) > 1 and isinstance(args[1], torch.Tensor) and not args[1].is_floating_point():
            args = (args[0], args[1] + offset, *args[2:])
        elif isinstance(kwargs.get("position_ids"), torch.Tensor):
            kwargs = {**kwargs, "position_ids": kwargs["position_ids"] + offset}
        return args, kwargs

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in rotary_modules(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


FEATURE_KEYS = ("num_mel_bins", "feature_size", "input_feat_size", "n_mels", "mel_dim", "input_dim", "num_features",
                "feature_dim", "input_size", "feature_projection_input_dim")
"""Config keys that give the width of an audio encoder's input features."""

CHANNEL_KEYS = ("num_codebooks", "num_channels", "audio_channels", "num_quantizers")
"""Config keys that give a third dimension of ids (codebooks) or the channels of a waveform."""

BATCH, LENGTH, FRAMES, SAMPLES = 2, 20, 64, 3840
"""The inputs' batch, sequence length (tokens, embeddings), feature frames (a multiple of the
encoders' subsampling, 8 at most) and waveform samples (two frames of a 24 kHz codec at 12.5 Hz)."""


PATCH = 2
"""Positions per patch where a forward pools its sequence into patches by ``patch_ids`` (BLT's
local encoder; as many patches as a ``num_`` count of shape ``()`` gives, half the sequence)."""


GRID = (1, 6, 12)
"""The image a vision tower is fed: frames, rows and columns of patches (rows and columns
multiples of 2 and 3, for the towers that merge 2 x 2 patches and Gemma 4's, which pools 3 x 3;
not square, so that swapped axes show)."""

GRID_NAMES = ("_thw", "image_sizes")
"""Name endings of a vision forward's grid argument (``grid_thw``: frames, rows, columns of
patches; ``image_sizes``: height and width in pixels)."""


def _patch(config) -> tuple[int, int, int] | None:
    """A vision config's channels, frames per patch and patch side (its own or its sub-configs'
    first), or ``None`` without ``patch_size``."""
    side = _sizes(config, ("patch_size",))
    if not side:
        return None
    channels = _sizes(config, ("in_channels", "num_channels")) or [3]
    frames = _sizes(config, ("temporal_patch_size", "patch_temporal")) or [1]
    return channels[0], frames[0], side[0]


def _sizes(config, keys) -> list[int]:
    """The positive integers ``config`` or its sub-configs hold under ``keys``, the config's first."""
    subs = [getattr(config, key, None) for key in getattr(config, "sub_configs", None) or {}]
    found = (getattr(c, key, None) for c in (config, *(s for s in subs if s is not None)) for key in keys)
    return list(dict.fromkeys(v for v in found if isinstance(v, int) and not isinstance(v, bool) and v > 0))


def _hidden(config) -> list[int]:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return _sizes(config, ("hidden_size", "d_model")) + _sizes(text, ("hidden_size",))


def _shapes(name: str, config) -> list[tuple[int, ...]]:
    """The shapes tried for the argument ``name`` of a forward whose module has ``config``."""
    if name.endswith("input_ids"):
        return [()] + [(BATCH, LENGTH, c) for c in _sizes(config, CHANNEL_KEYS)]
    patch = _patch(config)
    if name.endswith("embeds") or name.endswith("hidden_states"):
        flat = [(GRID[0] * GRID[1] * GRID[2], patch[0] * patch[1] * patch[2] ** 2)] if patch else []
        return [(BATCH, LENGTH, d) for d in dict.fromkeys(_hidden(config))] + flat  # flat: a tower's patches
    if name == "pixel_values" and patch:  # an image; its patches flat, batched, or as squares; a square image
        channels, frames, side = patch
        n, flat = GRID[0] * GRID[1] * GRID[2], channels * frames * side**2
        size, merge = getattr(config, "image_size", None), getattr(config, "spatial_merge_size", None)
        return [(1, channels, GRID[1] * side, GRID[2] * side), (n, flat), (1, n, flat), (n, channels, side, side),
                (1, n, channels, side, side), *([(1, channels, size, size)] if isinstance(size, int) else []),
                *([(n // merge**2, merge * side, merge * side, channels)] if isinstance(merge, int) else [])]
    if name.endswith("_thw"):
        return [GRID]
    if name.endswith("image_sizes") and patch:
        return [(GRID[1] * patch[2], GRID[2] * patch[2])]
    if name.endswith("merge_sizes"):
        return [(1,)]
    if name.endswith("sample_lengths") and _sizes(config, ("hop_length",)):  # each chunk's waveform: all frames
        return [(FRAMES * _sizes(config, ("hop_length",))[0],) * BATCH]
    if name.endswith("position_ids") and patch:
        return [(1, GRID[1] * GRID[2], 2)]
    if name.endswith("_mask"):
        return [(BATCH, LENGTH)]
    if name.startswith("num_"):
        return [()]
    if name == "input_features":
        widths = _sizes(config, FEATURE_KEYS)
        return [shape for f in widths for shape in ((BATCH, FRAMES, f), (BATCH, f, FRAMES))]
    if name == "input_values":
        return [(BATCH, c, SAMPLES) for c in _sizes(config, ("audio_channels",)) or [1]] + [(BATCH, SAMPLES)]
    if name == "past_values":
        return [(BATCH, FRAMES)]
    if name == "pixel_values_videos" and _sizes(config, ("frames_per_clip",)) and _sizes(config, ("crop_size",)):
        channels = _sizes(config, ("in_chans", "num_channels")) or [3]  # a clip: V-JEPA 2's frames and crops
        side = _sizes(config, ("crop_size",))[0]
        return [(1, _sizes(config, ("frames_per_clip",))[0], channels[0], side, side)]
    return []


def _merged_squares(shape: tuple[int, ...], config) -> bool:
    """Whether ``shape`` is an image's pixels as squares of merged patches, one per merged token
    (Inkling 2's: ``[tokens, merge * side, merge * side, channels]``), whose grid counts merged tokens."""
    merge = getattr(config, "spatial_merge_size", None)
    return isinstance(merge, int) and len(shape) == 4 and shape[1] == shape[2] == merge * _patch(config)[2]


def _merged_grid(config) -> tuple[int, int, int]:
    """:data:`GRID` counted in merged tokens (``spatial_merge_size`` patches a side)."""
    merge = config.spatial_merge_size
    return GRID[0], GRID[1] // merge, GRID[2] // merge


def unmade_arguments(module: nn.Module) -> list[str]:
    """The arguments ``module``'s forward requires (no default) for which :func:`candidates`
    makes no input (pixels, patch counts, ...)."""
    config = getattr(module, "config", None)
    return [name for name, p in _parameters(module).items()
            if p.default is inspect.Parameter.empty and not _shapes(name, config)]


def _parts(model: nn.Module, text: str | None) -> list[str]:
    """The model, its text model, then each outermost module holding a ``rotary_emb`` or a vision
    rotary module (:func:`rope.hf.vision.is_vision_rotary`: a vision tower, which may be the only
    part that rotates, as GLM-5-Next's is)."""
    owners = [name for name, m in model.named_modules() if isinstance(getattr(m, "rotary_emb", None), nn.Module)
              or any(is_vision_rotary(child) for child in m.children())]
    outermost = [n for n in owners if not any(n != o and n.startswith(o + ".") for o in owners if o)]
    return list(dict.fromkeys(["", *([text] if text else []), *outermost]))


def candidates(model: nn.Module, text: str | None = None, extra: tuple = ()) -> list[Feed]:
    """The feeds a probe tries, in order: token ids to the model and its text model ``text``;
    then, for the model, the text model and each outermost holder of a ``rotary_emb`` or a
    vision rotary module, every input its forward's first argument takes (:func:`_shapes`: ids,
    embeddings of its hidden size, audio features of its feature width, a waveform, a series)
    and ``inputs_embeds`` where it takes them (pixels as squares of merged patches with their
    grid counted in merged tokens), with the other arguments it requires where they are ids, masks or hidden
    states, an encoder's hidden states where it takes them, and a decoder's ids (of the same
    shape) beside an encoder's where it takes them. ``extra`` (``(name, shape)`` pairs: what a
    model type needs beyond its signature) is given to every feed of the model's own forward."""
    feeds = [Feed(extra=extra)] + ([Feed(part=text)] if text else [])
    for part in _parts(model, text):
        module = model.get_submodule(part) if part else model
        config = getattr(module, "config", None) or model.config
        parameters = _parameters(module)
        if not parameters:
            continue
        first = next(iter(parameters))
        wanted = [n for n, p in parameters.items() if n != first and p.default is inspect.Parameter.empty]
        wanted += ["encoder_hidden_states"] if "encoder_hidden_states" in parameters else []
        if first in ("pixel_values", "hidden_states"):  # a vision tower: its grid, where optional too
            wanted += [n for n in parameters if n.endswith("_thw") and n not in wanted]
        given = dict(extra) if not part else {}
        if any(not _shapes(n, config) for n in wanted if n not in given):
            continue  # it requires an argument the probe does not make
        others = {**{n: _shapes(n, config)[0] for n in wanted if n != first and n not in given}, **given}
        decoder = "decoder_input_ids" in parameters and "decoder_input_ids" not in others
        for name in dict.fromkeys([first, *(["inputs_embeds"] if "inputs_embeds" in parameters else [])]):
            for shape in _shapes(name, config):
                more = {"decoder_input_ids": shape if name.endswith("input_ids") else ()} if decoder else {}
                more.update((n, _merged_grid(config)) for n in others if n.endswith("_thw") and n not in given
                            and name == "pixel_values" and _merged_squares(shape, config))
                feeds.append(Feed(part, name, shape, tuple({**others, **more}.items())))
    return list(dict.fromkeys(feeds))

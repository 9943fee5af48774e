"""The timm towers of transformers' composite models, for the probe (:mod:`rope.hf.coverage`).

transformers builds some vision towers with timm (``TimmWrapperModel``, from a config naming a
timm ``architecture``). timm is not installed beside rope's torch (it needs torchvision), and
its towers are not shrunk by the probe's tiny sizes (timm's architecture fixes them: hundreds of
millions of parameters). What rope must know of such a tower is whether it rotates:

* :data:`STILL_TOWERS`: towers that do not rotate. A tiny model is built with a
  :class:`TimmStandIn` in their place (:func:`timm_standins`): the tower holds nothing
  :func:`rope.hf.patch` swaps or reads, so patch does on the real model what it does on the tiny
  one, and the probe's feed (token ids) never runs it. Gemma 3n's MobileNetV5 encoder
  (``mobilenetv5_300m_enc``: inverted-residual convolutions and multi-query attention over
  spatially downsampled keys, timm's ``mobilenetv5.py``) has no position rotation.
* :data:`ROTATING_TOWERS`: towers that rotate with timm's own code, which rope neither
  reproduces nor swaps: a model holding one is refused (:func:`rotating_tower`), naming the
  tower, since patched it would keep timm's float32 angles there. Perception Encoder's ViT
  (``vit_pe_core_large_patch14_336``, the frames' tower of PE Video and PE Audio-Video) is timm's
  Eva with ``use_rot_pos_emb=True`` and ``attn_type="rope"`` (timm's ``eva.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

STILL_TOWERS = {"mobilenetv5_300m_enc": "timm's MobileNetV5 encoder (convolutions and multi-query attention over "
                                        "downsampled keys, no rotation)"}
"""timm architectures that do not rotate, built as :class:`TimmStandIn` in a tiny model."""

ROTATING_TOWERS = {"vit_pe_core_large_patch14_336": "timm's Eva ViT with its own 2-D rotary embedding "
                                                    "(use_rot_pos_emb=True, attn_type='rope')"}
"""timm architectures that rotate with timm's code, which rope does not reproduce."""


def timm_architectures(config) -> dict[str, str]:
    """The timm architecture each sub-config of ``config`` (recursively, by key path) names."""
    found = {}

    def walk(sub, path):
        if getattr(sub, "model_type", None) in ("timm_wrapper", "gemma3n_vision") and isinstance(
                getattr(sub, "architecture", None), str):
            found[path] = sub.architecture
        for key in getattr(sub, "sub_configs", None) or {}:
            child = getattr(sub, key, None)
            if child is not None and hasattr(child, "to_dict"):
                walk(child, f"{path}.{key}" if path else key)

    walk(config, "")
    return found


class TimmStandIn(nn.Module):
    """In a tiny model, the place of a timm tower of :data:`STILL_TOWERS` (or, to find where a
    refused model holds its text model, of :data:`ROTATING_TOWERS`): no weights; its forward
    raises (the probe feeds no image)."""

    def __init__(self, config):
        super().__init__()
        self.config = config

    def forward(self, *args, **kwargs):
        raise RuntimeError(f"rope's stand-in for timm's {self.config.architecture} runs nothing: the probe feeds "
                           "this model no image")


AUTO_CLASSES = ("AutoModel", "AutoModelForImageClassification")
"""The auto classes transformers builds timm towers through (Gemma 3n's, PE Video's)."""


@contextlib.contextmanager
def timm_standins(architectures=STILL_TOWERS) -> Iterator[None]:
    """Within the context, transformers' auto classes (:data:`AUTO_CLASSES`) build a
    :class:`TimmStandIn` where they would build a timm tower of ``architectures``, for every
    model (a tower is built by its parent's modeling module, or by a part's of another module)."""
    import transformers

    autos = [getattr(transformers, name) for name in AUTO_CLASSES]
    held = [(auto, auto.__dict__.get("from_config")) for auto in autos]
    for auto in autos:
        auto.from_config = staticmethod(_standing_in(auto.from_config, architectures))
    try:
        yield
    finally:
        for auto, own in held:
            if own is None:
                del auto.from_config
            else:
                auto.from_config = own


def _standing_in(original, architectures):
    def from_config(config, **kwargs):
        if timm_architectures(config).get("") in architectures:
            return TimmStandIn(config)
        return original(config, **kwargs)
    return from_config


def rotating_tower(config) -> str | None:
    """Why a model of ``config`` is refused for a timm tower of :data:`ROTATING_TOWERS` it
    holds (naming the sub-config and the architecture), or ``None``."""
    for path, architecture in timm_architectures(config).items():
        if architecture in ROTATING_TOWERS:
            return (f"its {path} builds timm's {architecture}, {ROTATING_TOWERS[architecture]}, which rope neither "
                    "reproduces nor swaps: patched, that tower would keep timm's float32 angles")
    return None

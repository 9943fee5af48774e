"""The length-extrapolation experiment: train short, evaluate long, compare extension methods.

A small causal transformer is trained at L tokens on a synthetic language with local (Markov)
and long-range (keyed recall) structure, then evaluated at 1x to 16x L with every
context-extension method of the book: RoPE without scaling, PI, NTK-aware, dynamic NTK,
NTK-by-parts, YaRN, Llama 3, ReRoPE, Leaky ReRoPE and log-n on the RoPE model; ALiBi and NoPE
models trained the same way; PI and YaRN after a short fine-tune at a longer length. ReRoPE and
Leaky ReRoPE attend in linear memory (RoPE inside attention) and are also evaluated at longer
lengths (32x to 256x L in the cpu preset).

``python -m rope.experiment --preset cpu`` runs it (``tiny``: seconds, ``gpu``: larger).

Modules: :mod:`.data` the language, :mod:`.model` the transformer, :mod:`.methods` the position
schemes and the method registry, :mod:`.train` the training and evaluation loops,
:mod:`.presets` the settings, :mod:`.runner` the whole run and its results file. The committed
results of the cpu preset ship in ``results/`` as package data: :func:`committed_results` reads them.
"""

from .data import RecallTask, TaskSpec
from .methods import METHODS, Context, Method, PositionScheme
from .model import ModelSpec, TinyTransformer
from .presets import PRESETS, ExperimentConfig
from .runner import COMMITTED, committed_results, load_results, run

__all__ = [
    "COMMITTED",
    "METHODS",
    "PRESETS",
    "Context",
    "ExperimentConfig",
    "Method",
    "ModelSpec",
    "PositionScheme",
    "RecallTask",
    "TaskSpec",
    "TinyTransformer",
    "committed_results",
    "load_results",
    "run",
]

"""Run the experiment end to end and write the results file the chapter reads.

Three models are trained from the same initialization on the same batches at the training
length L: RoPE (``rope``), ALiBi (``alibi``) and no position encoding (``nope``). Two copies of
the RoPE model are then fine-tuned at ``finetune_factor`` x L, with PI and with YaRN at that
factor (same tokens per step, so the batch shrinks by the factor). Every method of
:data:`rope.experiment.methods.METHODS` is evaluated at each length of ``eval_lengths`` on the
same held-out sequences.

The run seed (``ExperimentConfig.seed``, ``--seed``) sets the initialization and the training
and fine-tuning batches; the language and the held-out sequences do not depend on it, so runs
with different seeds are scored on the same tokens and their spread is the training noise.

Determinism: fixed seeds for initialization and for every batch, deterministic torch
algorithms, and the thread count of the preset (one for ``tiny``); the thread count, device and
torch version are recorded with the results. On CUDA a few kernels the model needs have no
deterministic implementation (the negative log-likelihood among them), so there the
deterministic mode only warns about them, and cuBLAS gets the fixed workspace
(``CUBLAS_WORKSPACE_CONFIG=:4096:8``) that its deterministic mode requires: a GPU run repeats
on the same device and software up to those kernels' summation order.
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

from ..checks import flag
from .data import RecallTask, describe
from .methods import METHODS, Context
from .model import ModelSpec, TinyTransformer
from .presets import PRESETS, ExperimentConfig
from .train import _progress, evaluate, train

PRETRAIN_SEED, FINETUNE_SEED, EVAL_SEED = 1_000_000, 2_000_000, 3_000_000
RUN_SEED_STRIDE = 10_000_000  # the training batches of run seed r start at PRETRAIN_SEED + r * stride
BASE_MODELS = ("rope", "alibi", "nope")
FINETUNED_MODELS = {"pi_finetuned": "pi_finetuned", "yarn_finetuned": "yarn_finetuned"}  # model -> method


def _context(config: ExperimentConfig, spec: ModelSpec, length: int) -> Context:
    return Context(
        length=length, training_length=config.training_length, head_dim=spec.head_dim,
        num_heads=spec.num_heads, rope_theta=config.rope_theta, finetune_factor=float(config.finetune_factor),
    )


def _summary(losses: list[float], seconds: float, length: int) -> dict:
    tail = losses[-max(1, len(losses) // 10):]
    return {"steps": len(losses), "length": length, "first_loss": losses[0],
            "final_loss": sum(tail) / len(tail), "wall_time_s": seconds}


def run(
    config: ExperimentConfig | str,
    *,
    methods: list[str] | None = None,
    output: str | Path | None = None,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> dict:
    """Train, fine-tune and evaluate; return the results (and write them to ``output`` as JSON)."""
    if isinstance(config, str):
        if config not in PRESETS:
            raise ValueError(f"unknown preset {config!r}; expected one of {', '.join(PRESETS)}")
        config = PRESETS[config]
    if not isinstance(config, ExperimentConfig):
        raise TypeError(f"config must be an ExperimentConfig or a preset name, got {type(config).__name__}")
    flag("progress", progress)
    if isinstance(methods, str):
        raise TypeError(f"methods must be a list of method names, got str {methods!r}")
    names = list(METHODS) if methods is None else list(methods)
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; expected names from {', '.join(METHODS)}")

    device = torch.device(device)
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    previous = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
        results = _run(config, names, device, progress)
    finally:
        torch.set_num_threads(previous[0])
        torch.use_deterministic_algorithms(previous[1], warn_only=previous[2])
    if output is not None:
        path = Path(output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1) + "\n")
        path.with_suffix(".md").write_text(results_table(results))
    return results


def _run(config: ExperimentConfig, names: list[str], device: torch.device, progress: bool) -> dict:
    started = time.perf_counter()

    task = RecallTask(config.task)
    spec = ModelSpec(config.task.vocab_size, config.d_model, config.num_heads, config.num_layers, config.mlp_ratio)
    needed = {METHODS[n].model for n in names}
    models, training = {}, {}

    for name in BASE_MODELS:
        if name not in needed and not (name == "rope" and needed & set(FINETUNED_MODELS)):
            continue
        torch.manual_seed(config.seed)
        model = TinyTransformer(spec).to(device)
        t0 = time.perf_counter()
        losses = train(
            model, METHODS[name].build(_context(config, spec, config.training_length)), task,
            steps=config.steps, batch_size=config.batch_size, length=config.training_length,
            learning_rate=config.learning_rate, warmup_steps=config.warmup_steps,
            weight_decay=config.weight_decay, data_seed=PRETRAIN_SEED + config.seed * RUN_SEED_STRIDE, device=device,
            progress=progress, description=f"train {name}",
        )
        models[name], training[name] = model, _summary(losses, time.perf_counter() - t0, config.training_length)

    finetune_length = config.finetune_factor * config.training_length
    for name, method in FINETUNED_MODELS.items():
        if name not in needed:
            continue
        model = copy.deepcopy(models["rope"])
        t0 = time.perf_counter()
        losses = train(
            model, METHODS[method].build(_context(config, spec, finetune_length)), task,
            steps=config.finetune_steps, batch_size=max(1, config.batch_size // config.finetune_factor),
            length=finetune_length, learning_rate=config.finetune_learning_rate,
            warmup_steps=max(1, config.finetune_steps // 10), weight_decay=config.weight_decay,
            data_seed=FINETUNE_SEED + config.seed * RUN_SEED_STRIDE, device=device, progress=progress, description=f"fine-tune {name}",
        )
        models[name], training[name] = model, _summary(losses, time.perf_counter() - t0, finetune_length)

    lengths = config.eval_lengths
    eval_sets = {
        length: task.sample(max(1, config.eval_tokens // length), length, EVAL_SEED + length)
        for length in lengths
    }
    results = {n: {"label": METHODS[n].label, "model": METHODS[n].model, "loss": [], "markov_loss": [],
                   "recall_loss": [], "recall_accuracy": []} for n in names}
    t0 = time.perf_counter()
    jobs = [(n, length) for n in names for length in lengths]
    for name, length in _progress(jobs, progress, desc="evaluate", leave=False):
        tokens, kinds = eval_sets[length]
        metrics = evaluate(
            models[METHODS[name].model], METHODS[name], _context(config, spec, length),
            tokens.to(device), kinds, batch_size=max(1, config.eval_batch_tokens // length),
        )
        for key, value in metrics.items():
            results[name][key].append(value)
    eval_seconds = time.perf_counter() - t0

    return {
        "preset": config.name,
        "config": config.to_dict(),
        "environment": {
            "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "threads": torch.get_num_threads(),
            "finished_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        },
        "task": {
            "vocab_size": config.task.vocab_size,
            "markov_entropy_rate": task.entropy_rate(),
            "samples": [describe(task, length) for length in lengths],
        },
        "training": training,
        "lengths": lengths,
        "methods": results,
        "eval_wall_time_s": eval_seconds,
        "wall_time_s": time.perf_counter() - started,
    }


def results_table(results: dict) -> str:
    """The results as a markdown page: how the run was made, then loss and recall accuracy per
    method (rows) and evaluation length (columns)."""
    env, lengths = results["environment"], results["lengths"]
    training_length = results["config"]["training_length"]
    lines = [
        f"# Extrapolation experiment, preset `{results['preset']}`",
        "",
        f"Run by `python -m rope.experiment --preset {results['preset']}` on {env['device']} "
        f"({env['threads']} thread(s)), torch {env['torch']}, Python {env['python']}, "
        f"finished {env.get('finished_utc', 'at an unrecorded time')} UTC, "
        f"wall time {results['wall_time_s']:.0f} s. Training length L = {training_length}.",
    ]
    for metric, title in (("loss", "Mean next-token loss (nats)"), ("recall_accuracy", "Recall accuracy")):
        lines += ["", f"## {title}", "",
                  "| method | " + " | ".join(f"{n // training_length}x ({n})" for n in lengths) + " |",
                  "| --- | " + " | ".join("---" for _ in lengths) + " |"]
        lines += [f"| {row['label']} | " + " | ".join(f"{v:.3f}" for v in row[metric]) + " |"
                  for row in results["methods"].values()]
    return "\n".join(lines) + "\n"


def load_results(path: str | Path) -> dict:
    """Read a results file and check that every method has a finite number at every length."""
    results = json.loads(Path(path).read_text())
    count = len(results["lengths"])
    for name, row in results["methods"].items():
        for key in ("loss", "markov_loss", "recall_loss", "recall_accuracy"):
            values = row[key]
            if len(values) != count or not all(isinstance(v, float) and math.isfinite(v) for v in values):
                raise ValueError(f"results file {path}: method {name!r} has a missing or non-finite {key}")
    return results

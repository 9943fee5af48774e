"""Run the experiment end to end and write its results file (the chapter reads the committed ones).

Three models are trained from the same initialization on the same batches at the training
length L: RoPE (``rope``), ALiBi (``alibi``) and no position encoding (``nope``). Two copies of
the RoPE model are then fine-tuned at ``finetune_factor`` x L, with PI and with YaRN at that
factor (same tokens per step, so the batch shrinks by the factor). Every method of
:data:`rope.experiment.methods.METHODS` is evaluated at each length of ``eval_lengths`` on the
same held-out sequences; the methods that attend in O(seq) memory (``Method.linear_memory``:
ReRoPE and Leaky ReRoPE, with RoPE inside attention) also at the longer ``long_eval_lengths``,
where the other methods' seq x seq logits would not fit.

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

import contextlib
import copy
import datetime
import json
import math
import os
import platform
import time
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

import torch

from .._checks import flag
from .data import RecallTask, describe
from .methods import METHODS, Context
from .model import ModelSpec, TinyTransformer
from .presets import PRESETS, ExperimentConfig
from .train import evaluate, progress_bar, train

PRETRAIN_SEED, FINETUNE_SEED, EVAL_SEED = 1_000_000, 2_000_000, 3_000_000
RUN_SEED_STRIDE = 10_000_000  # the training batches of run seed r start at PRETRAIN_SEED + r * stride
BASE_MODELS = ("rope", "alibi", "nope")
FINETUNED_MODELS = {"pi_finetuned": "pi_finetuned", "yarn_finetuned": "yarn_finetuned"}  # model -> method


def _context(config: ExperimentConfig, spec: ModelSpec, length: int) -> Context:
    """The :class:`Context` a method's scheme is built from, for sequences of ``length`` tokens."""
    return Context(
        length=length, training_length=config.training_length, head_dim=spec.head_dim,
        num_heads=spec.num_heads, rope_theta=config.rope_theta, finetune_factor=float(config.finetune_factor),
    )


def _summary(losses: list[float], seconds: float, length: int) -> dict:
    """A training run in the results file: steps, length, first loss, mean loss of the last tenth, wall time."""
    tail = losses[-max(1, len(losses) // 10):]
    return {"steps": len(losses), "length": length, "first_loss": losses[0],
            "final_loss": sum(tail) / len(tail), "wall_time_s": seconds}


def _checked_config(config: ExperimentConfig | str) -> ExperimentConfig:
    """``config`` itself, or the preset it names; ValueError for an unknown name, TypeError otherwise."""
    if isinstance(config, str):
        if config not in PRESETS:
            raise ValueError(f"unknown preset {config!r}; expected one of {', '.join(PRESETS)}")
        config = PRESETS[config]
    if not isinstance(config, ExperimentConfig):
        raise TypeError(f"config must be an ExperimentConfig or a preset name, got {type(config).__name__}")
    return config


def checked_methods(methods: list[str] | None) -> list[str]:
    """The method names to evaluate: every method of :data:`METHODS` for None, else ``methods``,
    checked (known names, at least one, none twice).

    Args:
        methods: names from :data:`METHODS`, or ``None`` for all.
    """
    if isinstance(methods, str) or not isinstance(methods, (Iterable, type(None))):
        raise TypeError(f"methods must be a list of method names, got {type(methods).__name__} {methods!r}")
    names = list(METHODS) if methods is None else list(methods)
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"methods must be a list of method names (str), got {names!r}")
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; expected names from {', '.join(METHODS)}")
    if not names:
        raise ValueError("methods must name at least one method (None: every method)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:  # each would be evaluated twice into one row, whose lists would outgrow the lengths
        raise ValueError(f"methods must name each method once, got {', '.join(map(repr, repeated))} more than once")
    return names


def run(
    config: ExperimentConfig | str,
    *,
    methods: list[str] | None = None,
    output: str | Path | None = None,
    overwrite: bool = False,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> dict:
    """Train, fine-tune and evaluate; return the results, and with ``output`` write them there as
    JSON with the markdown table of :func:`results_table` beside it (.md).

    Every argument is checked before anything is trained (a run takes minutes): an existing
    results file (the JSON or its table) is refused with ``FileExistsError`` unless
    ``overwrite=True`` (the committed results under ``rope/experiment/results/`` are replaced only
    on request), an ``output`` that could not be written (:func:`check_output`) or a ``device``
    that cannot hold tensors (:func:`check_device`) with ``ValueError`` naming it, and a config
    whose methods cannot be built at some evaluation length (:func:`check_schemes`) with the
    error naming the config's field.

    Args:
        config: an :class:`ExperimentConfig`, or the name of a preset (``"tiny"``, ``"cpu"``, ``"gpu"``).
        methods: the names of the methods to evaluate (:func:`checked_methods`), or ``None`` for all.
        output: the path of the results JSON, or ``None`` to write nothing.
        overwrite: replace existing results files.
        device: the device to train and evaluate on.
        progress: show progress on stderr.
    """
    config = _checked_config(config)
    flag("progress", progress)
    flag("overwrite", overwrite)
    names = checked_methods(methods)
    device = check_device(device)
    check_schemes(config, names)
    if output is not None:
        output = check_output(output, overwrite=overwrite)
    with _deterministic(config, device):
        results = _run(config, names, device, progress)
    if output is not None:
        _write(results, output, overwrite)
    return results


def check_schemes(config: ExperimentConfig, names: list[str]) -> None:
    """Build the scheme of every method of ``names`` at every length it will be evaluated at (a
    ``per_prefix`` method also at its first prefix, L: dynamic NTK's base grows with the length,
    so these two are its extremes), before anything is trained: a config whose
    frequencies cannot be formed at some length (e.g. a ``rope_theta`` whose scaled frequencies
    underflow float32) is refused with the error naming the field, not after the training.

    Args:
        config: the run's config.
        names: the methods evaluated (:func:`checked_methods`).
    """
    spec = config.model_spec
    for name in names:
        method = METHODS[name]
        lengths = config.eval_lengths + (config.long_eval_lengths if method.linear_memory else [])
        for length in lengths:
            for end in {min(config.training_length, length), length} if method.per_prefix else {length}:
                method.build(_context(config, spec, end))


def results_files(output: str | Path) -> tuple[Path, Path]:
    """The two files a run writes for ``output``: the JSON itself and its markdown table (.md).

    Args:
        output: the path of the results JSON.
    """
    output = Path(output)
    return output, output.with_suffix(".md")


def check_output(output: str | Path, *, overwrite: bool = False, hint: str = "overwrite=True",
                 name: str = "output") -> Path:
    """``output`` as a :class:`~pathlib.Path` after checking that a run may write there, so that a
    run never trains for minutes and then fails to write: ``TypeError`` unless it is a str or
    path; ``ValueError`` naming the argument (``name``: the command line passes its flag) for a
    name ending in ``.md`` (the table beside it would be the file itself), for a results file
    that is a folder, and for a folder or file that cannot be created or written (the nearest
    existing folder above the results must be a writable folder, not a file, and the folders and
    files are then created and removed again, :func:`_try_writing`); ``FileExistsError`` naming
    the file and ``hint`` (how to ask for the replacement) when either results file exists and
    not ``overwrite``.

    Args:
        output: the path of the results JSON.
        overwrite: existing results files may be replaced.
        hint: how the caller asks for the replacement, for the error.
        name: the argument's name in the errors.
    """
    if not isinstance(output, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or path, got {type(output).__name__} {output!r}")
    output = Path(output)
    if output.suffix.lower() == ".md":  # .MD too: on a case-insensitive file system the table would be the JSON
        raise ValueError(f"{name} must not end in .md (the markdown table is written beside it as .md), "
                         f"got {output}")
    try:
        _check_writable(output, overwrite, hint, name)
    except FileExistsError:  # existing results, without overwrite
        raise
    except OSError as error:  # e.g. a name too long for the file system, from the first look at it
        raise ValueError(f"{name}: the results {output} cannot be written there: {error.strerror or error}") from None
    try:
        _try_writing(output)
    except OSError as error:  # a broken link in the way included (FileExistsError)
        raise ValueError(f"{name}: the results {output} cannot be written there: {error.strerror or error}") from None
    return output


def _check_writable(output: Path, overwrite: bool, hint: str, name: str) -> None:
    """:func:`check_output`'s look at the file system (its ``OSError`` left to the caller)."""
    for path in results_files(output):
        if path.is_dir():
            raise ValueError(f"{name}: the results file {path} is a folder; name a file")
    # the nearest existing folder above the results: the run creates the rest (Path('x').parent is '.')
    nearest = next(folder for folder in output.absolute().parents if folder.exists())
    if not nearest.is_dir():
        raise ValueError(f"{name}: {nearest} is a file, so no results folder can be created at {output.parent}; "
                         "name a folder")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise ValueError(f"{name}: the folder {nearest} is not writable, so the results {output} cannot be "
                         "written there")
    if not overwrite:
        existing = [str(path) for path in results_files(output) if path.exists()]
        if existing:
            named = (f"file {existing[0]} exists; pass {hint} to replace it" if len(existing) == 1
                     else f"files {' and '.join(existing)} exist; pass {hint} to replace them")
            raise FileExistsError(f"results {named}, or write the results elsewhere")


def _try_writing(output: Path) -> None:
    """Create the folders and the two results files of ``output`` as the run will, then remove
    what was created (an existing file is opened for appending, which changes nothing): the one
    test that holds where permissions do not tell (root, read-only or virtual file systems such
    as /proc) and for names too long for the file system; its ``OSError`` is the caller's."""
    created = []  # folders made here, outermost first
    try:
        for folder in reversed(output.absolute().parents):
            if not folder.exists():
                folder.mkdir()
                created.append(folder)
        for path in results_files(output):
            existed = path.exists()
            with open(path, "a" if existed else "x"):
                pass
            if not existed:
                path.unlink()
    finally:
        for folder in reversed(created):
            folder.rmdir()


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a :class:`torch.device` after checking that the run can use it, before any
    training: ``TypeError`` unless it is a str or device; ``ValueError`` naming ``device`` for a
    name torch does not know, for ``meta`` (no values to train on), for CUDA without an available
    GPU or beyond the GPUs present, and for any other device that cannot allocate a tensor.

    Args:
        device: a device or its name.
    """
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__} {device!r}")
    try:
        device = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device {device!r} is not a torch device (e.g. cpu, cuda, cuda:1): {error}") from None
    if device.type == "meta":
        raise ValueError("device meta holds no values to train on; expected e.g. cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device} needs CUDA, which is not available here (expected e.g. cpu)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {device}: there are {torch.cuda.device_count()} CUDA devices "
                             f"(indices 0 to {torch.cuda.device_count() - 1})")
    try:
        torch.empty(1, device=device)  # any other backend (mps, xpu, ...) must be built in and present
    except (RuntimeError, AssertionError) as error:  # AssertionError: torch built without CUDA
        raise ValueError(f"device {device} cannot hold tensors here: {error}") from None
    return device


@contextlib.contextmanager
def _deterministic(config: ExperimentConfig, device: torch.device):
    """Deterministic torch algorithms (warn-only on CUDA) and the preset's thread count while the
    block runs, then the previous settings back (see the module docstring)."""
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    threads, deterministic, warn_only = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                                         torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def _write(results: dict, path: Path, overwrite: bool) -> None:
    """The results as JSON at ``path`` and as the markdown of :func:`results_table` beside it (.md);
    without ``overwrite``, a results file that appeared during the run is refused, not replaced."""
    check_output(path, overwrite=overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "w" if overwrite else "x"
    json_path, table_path = results_files(path)
    with open(json_path, mode) as file:
        file.write(json.dumps(results, indent=1) + "\n")
    with open(table_path, mode) as file:
        file.write(results_table(results))


def _run(config: ExperimentConfig, names: list[str], device: torch.device, progress: bool) -> dict:
    """Train the models that ``names`` need, evaluate every method at every length: the results dict."""
    started = time.perf_counter()
    task = RecallTask(config.task)
    spec = config.model_spec
    # the held-out sequences first: lengths beyond memory fail here, not after the training
    held_out = _held_out(config, task, config.eval_lengths)
    long_names = [n for n in names if METHODS[n].linear_memory]
    long_held_out = _held_out(config, task, config.long_eval_lengths) if long_names else {}
    models, training = _train_models(config, spec, task, names, device, progress)
    t0 = time.perf_counter()
    methods = _evaluate_methods(config, spec, models, held_out, names, device, progress)
    long_methods = (_evaluate_methods(config, spec, models, long_held_out, long_names, device, progress)
                    if long_names else {})
    eval_seconds = time.perf_counter() - t0
    return {
        "preset": config.name,
        "config": config.to_dict(),
        "environment": _environment(device),
        "task": {
            "vocab_size": config.task.vocab_size,
            "markov_entropy_rate": task.entropy_rate(),
            "samples": [describe(task, length) for length in config.eval_lengths],
        },
        "training": training,
        "lengths": config.eval_lengths,
        "methods": methods,
        "long": {
            "lengths": list(long_held_out),
            "samples": [describe(task, length) for length in long_held_out],
            "methods": long_methods,
        },
        "eval_wall_time_s": eval_seconds,
        "wall_time_s": time.perf_counter() - started,
    }


def _models_to_train(names: list[str]) -> list[str]:
    """The models the methods ``names`` are evaluated on, in training order: the base models of
    :data:`BASE_MODELS` first (``rope`` also when a fine-tuned model starts from it), then the
    fine-tuned ones."""
    needed = {METHODS[n].model for n in names}
    if needed & set(FINETUNED_MODELS):
        needed.add("rope")
    return [name for name in (*BASE_MODELS, *FINETUNED_MODELS) if name in needed]


def _train_models(
    config: ExperimentConfig, spec: ModelSpec, task: RecallTask, names: list[str], device: torch.device,
    progress: bool,
) -> tuple[dict[str, TinyTransformer], dict[str, dict]]:
    """The trained models that ``names`` need and the :func:`_summary` of each training run, by model name."""
    models, training = {}, {}
    for name in _models_to_train(names):
        if name in FINETUNED_MODELS:
            models[name], training[name] = _finetune(config, spec, task, models["rope"], name, device, progress)
        else:
            models[name], training[name] = _pretrain(config, spec, task, name, device, progress)
    return models, training


def _pretrain(
    config: ExperimentConfig, spec: ModelSpec, task: RecallTask, name: str, device: torch.device, progress: bool,
) -> tuple[TinyTransformer, dict]:
    """Base model ``name`` trained from the run seed's initialization at the training length L,
    and the :func:`_summary` of its training."""
    torch.manual_seed(config.seed)
    model = TinyTransformer(spec).to(device)
    length = config.training_length
    t0 = time.perf_counter()
    losses = train(
        model, METHODS[name].build(_context(config, spec, length)), task,
        steps=config.steps, batch_size=config.batch_size, length=length,
        learning_rate=config.learning_rate, warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
        data_seed=PRETRAIN_SEED + config.seed * RUN_SEED_STRIDE, device=device,
        progress=progress, description=f"train {name}",
    )
    return model, _summary(losses, time.perf_counter() - t0, length)


def _finetune(
    config: ExperimentConfig, spec: ModelSpec, task: RecallTask, rope_model: TinyTransformer, name: str,
    device: torch.device, progress: bool,
) -> tuple[TinyTransformer, dict]:
    """A copy of ``rope_model`` fine-tuned at ``finetune_factor`` x L with the method
    ``FINETUNED_MODELS[name]`` (same tokens per step: the batch shrinks by the factor), and the
    :func:`_summary` of its fine-tuning."""
    model = copy.deepcopy(rope_model)
    length = config.finetune_factor * config.training_length
    t0 = time.perf_counter()
    losses = train(
        model, METHODS[FINETUNED_MODELS[name]].build(_context(config, spec, length)), task,
        steps=config.finetune_steps, batch_size=max(1, config.batch_size // config.finetune_factor),
        length=length, learning_rate=config.finetune_learning_rate,
        warmup_steps=max(1, config.finetune_steps // 10), weight_decay=config.weight_decay,
        data_seed=FINETUNE_SEED + config.seed * RUN_SEED_STRIDE, device=device,
        progress=progress, description=f"fine-tune {name}",
    )
    return model, _summary(losses, time.perf_counter() - t0, length)


def _held_out(
    config: ExperimentConfig, task: RecallTask, lengths: list[int],
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """The evaluation sequences and their kinds at each of ``lengths``: about ``eval_tokens`` tokens
    (at least one sequence) drawn with seed ``EVAL_SEED + length``, whatever the run seed."""
    return {length: task.sample(max(1, config.eval_tokens // length), length, EVAL_SEED + length)
            for length in lengths}


def _evaluate_methods(
    config: ExperimentConfig, spec: ModelSpec, models: dict[str, TinyTransformer],
    held_out: dict[int, tuple[torch.Tensor, torch.Tensor]], names: list[str], device: torch.device, progress: bool,
) -> dict[str, dict]:
    """Every metric of :func:`evaluate` for each method of ``names`` on the sequences of ``held_out``
    (one list per metric, in the order of its lengths), with its label and model."""
    results = {n: {"label": METHODS[n].label, "model": METHODS[n].model, "loss": [], "markov_loss": [],
                   "recall_loss": [], "recall_accuracy": []} for n in names}
    jobs = [(n, length) for n in names for length in held_out]
    for name, length in progress_bar(jobs, progress, "evaluate"):
        tokens, kinds = held_out[length]
        metrics = evaluate(
            models[METHODS[name].model], METHODS[name], _context(config, spec, length),
            tokens.to(device), kinds, batch_size=max(1, config.eval_batch_tokens // length),
        )
        for key, value in metrics.items():
            results[name][key].append(value)
    return results


def _environment(device: torch.device) -> dict:
    """Where and when the run was made: device name, torch and Python versions, platform, threads, UTC time."""
    return {
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "threads": torch.get_num_threads(),
        "finished_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
    }


def results_table(results: dict) -> str:
    """The results as a markdown page: how the run was made, then loss and recall accuracy per
    method (rows) and evaluation length (columns), then the same for the longer lengths of the
    methods that attend in O(seq) memory.

    Args:
        results: the results dict of :func:`run` (or :func:`load_results`).
    """
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
    sections = [("", lengths, results["methods"])]
    if results["long"]["lengths"]:
        sections.append((", O(seq)-memory methods at longer lengths", results["long"]["lengths"],
                         results["long"]["methods"]))
    for suffix, lengths, methods in sections:
        for metric, title in (("loss", "Mean next-token loss (nats)"), ("recall_accuracy", "Recall accuracy")):
            lines += ["", f"## {title}{suffix}", "",
                      "| method | " + " | ".join(f"{n // training_length}x ({n})" for n in lengths) + " |",
                      "| --- | " + " | ".join("---" for _ in lengths) + " |"]
            lines += [f"| {row['label']} | " + " | ".join(f"{v:.3f}" for v in row[metric]) + " |"
                      for row in methods.values()]
    return "\n".join(lines) + "\n"


def load_results(path: str | Path) -> dict:
    """Read a results file and check that every method has a finite number at every length, the
    longer lengths of the O(seq)-memory methods included.

    Args:
        path: the results JSON.
    """
    results = json.loads(Path(path).read_text())
    long = results["long"]
    for where, lengths, methods in (("", results["lengths"], results["methods"]),
                                    (" at the longer lengths", long["lengths"], long["methods"])):
        for name, row in methods.items():
            for key in ("loss", "markov_loss", "recall_loss", "recall_accuracy"):
                values = row[key]
                if len(values) != len(lengths) or not all(isinstance(v, float) and math.isfinite(v)
                                                          for v in values):
                    raise ValueError(f"results file {path}: method {name!r} has a missing or non-finite {key}{where}")
    return results


COMMITTED = (
    "extrapolation_results.json",
    "extrapolation_results_seed1.json",
    "extrapolation_results_seed2.json",
)
"""The committed results files of the cpu preset (run seeds 0, 1, 2), shipped as package data in
``rope/experiment/results/`` with their markdown tables (.md) beside them."""


def committed_results(name: str = "extrapolation_results.json") -> dict:
    """One of the :data:`COMMITTED` results files, read from the installed package (a clone or a
    wheel alike) and checked by :func:`load_results`.

    Args:
        name: one of :data:`COMMITTED`.
    """
    if name not in COMMITTED:
        raise ValueError(f"unknown committed results file {name!r}: expected one of {', '.join(COMMITTED)}")
    with resources.as_file(resources.files(__package__).joinpath("results", name)) as path:
        return load_results(path)

"""``python -m rope.experiment --preset cpu --out DIR``: run the extrapolation experiment, write its JSON.

The results go to a folder of the caller's (``--out``, default ``./rope-experiment-results``) or
to one file (``--output``); an existing results file, such as the committed
``rope/experiment/results/extrapolation_results.json``, is refused before anything is trained unless
``--overwrite`` is given. Every argument is checked before the run starts (a usage error naming
it, exit status 2): a results path that cannot be written, a device torch cannot use, a seed
outside [0, 2^64 - 1].
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from .methods import METHODS
from .presets import MAX_SEED, PRESETS
from .runner import check_device, check_output, checked_methods, results_files, run

DEFAULT_OUT = "rope-experiment-results"
"""The results folder when neither ``--out`` nor ``--output`` is given, relative to the working directory."""


def results_name(preset: str, seed: int) -> str:
    """The results file's name in the ``--out`` folder, as the committed files in ``rope/experiment/results/`` are
    named: ``extrapolation_results.json`` for the cpu preset, ``extrapolation_results_<preset>.json``
    otherwise, ``_seed<N>`` appended for a seed other than the preset's.

    Args:
        preset: the name of a preset of :data:`rope.experiment.presets.PRESETS`.
        seed: the run seed.
    """
    suffix = "" if preset == "cpu" else f"_{preset}"
    if seed != PRESETS[preset].seed:
        suffix += f"_seed{seed}"
    return f"extrapolation_results{suffix}.json"


def _path(text: str) -> str:
    """``--out`` and ``--output``: a non-empty path (an empty one would silently mean the default or '.')."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got an empty name")
    return text


def _seed(text: str) -> int:
    """``--seed``: an int in [0, :data:`~.presets.MAX_SEED`] (what the run's torch.manual_seed takes)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int from 0 to 2^64 - 1, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected an int from 0 to 2^64 - 1 (what torch.manual_seed takes), "
                                         f"got {value}")
    return value


def _device(text: str):
    """``--device``: a torch device this machine can use (:func:`.runner.check_device`)."""
    try:
        return check_device(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rope.experiment",
        description="Train a small RoPE / ALiBi / NoPE transformer at a short context and evaluate "
        "context-extension methods at 1x to 16x the training length.",
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="DIR", type=_path, default=None,
                       help=f"results folder, created if missing (default: ./{DEFAULT_OUT}); the results JSON "
                       "in it is named as in rope/experiment/results/: extrapolation_results.json for the cpu preset, "
                       "extrapolation_results_<preset>.json otherwise, _seed<N> appended for a --seed other "
                       "than the preset's; its markdown table is written beside it (.md)")
    where.add_argument("--output", metavar="FILE", type=_path, default=None,
                       help="the results JSON file itself instead of a folder (its .md table beside it)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace existing results files (without it they are refused before the run starts, "
                        "e.g. the committed rope/experiment/results/extrapolation_results.json)")
    parser.add_argument("--seed", type=_seed, default=None,
                        help="run seed from 0 to 2^64 - 1: initialization and training batches (default: the "
                        "preset's, 0)")
    parser.add_argument("--device", type=_device, default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=None)
    parser.add_argument("--no-progress", action="store_true",
                        help="hide the progress display (tqdm bars; plain lines on stderr without tqdm)")
    args = parser.parse_args(argv)
    try:
        checked_methods(args.methods)
    except ValueError as error:
        parser.error(f"argument --methods: {error}")
    config = PRESETS[args.preset]
    if args.seed is not None:
        config = replace(config, seed=args.seed)
    output = args.output or Path(args.out or DEFAULT_OUT) / results_name(args.preset, config.seed)
    try:
        output = check_output(output, overwrite=args.overwrite, hint="--overwrite",
                              name="--out" if args.output is None else "--output")
    except (FileExistsError, ValueError) as error:
        parser.error(str(error))
    results = run(config, methods=args.methods, output=output, overwrite=args.overwrite, device=args.device,
                  progress=not args.no_progress)
    lengths = results["lengths"]
    print(f"{'method':<18}" + "".join(f"{'loss@' + str(n):>11}" for n in lengths)
          + "".join(f"{'acc@' + str(n):>10}" for n in lengths))
    for row in results["methods"].values():
        print(f"{row['label']:<18}" + "".join(f"{v:>11.3f}" for v in row["loss"])
              + "".join(f"{v:>10.3f}" for v in row["recall_accuracy"]))
    json_path, table_path = results_files(output)
    print(f"wrote {json_path} and its table {table_path} ({results['wall_time_s']:.0f} s)")


if __name__ == "__main__":
    main()

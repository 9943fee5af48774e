"""``python -m rope.experiment --preset cpu --out DIR``: run the extrapolation experiment, write its JSON.

The results go to a folder of the caller's (``--out``, default ``./rope-experiment-results``) or
to one file (``--output``); an existing results file, such as the committed
``rope/experiment/results/extrapolation_results.json``, is refused before anything is trained unless
``--overwrite`` is given.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from .methods import METHODS
from .presets import PRESETS
from .runner import check_output, results_files, run

DEFAULT_OUT = "rope-experiment-results"
"""The results folder when neither ``--out`` nor ``--output`` is given, relative to the working directory."""


def results_name(preset: str, seed: int) -> str:
    """The results file's name in the ``--out`` folder, as the committed files in ``rope/experiment/results/`` are
    named: ``extrapolation_results.json`` for the cpu preset, ``extrapolation_results_<preset>.json``
    otherwise, ``_seed<N>`` appended for a seed other than the preset's."""
    suffix = "" if preset == "cpu" else f"_{preset}"
    if seed != PRESETS[preset].seed:
        suffix += f"_seed{seed}"
    return f"extrapolation_results{suffix}.json"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rope.experiment",
        description="Train a small RoPE / ALiBi / NoPE transformer at a short context and evaluate "
        "context-extension methods at 1x to 16x the training length.",
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", metavar="DIR", default=None,
                       help=f"results folder, created if missing (default: ./{DEFAULT_OUT}); the results JSON "
                       "in it is named as in rope/experiment/results/: extrapolation_results.json for the cpu preset, "
                       "extrapolation_results_<preset>.json otherwise, _seed<N> appended for a --seed other "
                       "than the preset's; its markdown table is written beside it (.md)")
    where.add_argument("--output", metavar="FILE", default=None,
                       help="the results JSON file itself instead of a folder (its .md table beside it)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace existing results files (without it they are refused before the run starts, "
                        "e.g. the committed rope/experiment/results/extrapolation_results.json)")
    parser.add_argument("--seed", type=int, default=None,
                        help="run seed: initialization and training batches (default: the preset's, 0)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=None)
    parser.add_argument("--no-progress", action="store_true",
                        help="hide the progress display (tqdm bars; plain lines on stderr without tqdm)")
    args = parser.parse_args(argv)
    config = PRESETS[args.preset]
    if args.seed is not None:
        config = replace(config, seed=args.seed)
    output = args.output or Path(args.out or DEFAULT_OUT) / results_name(args.preset, config.seed)
    try:
        output = check_output(output, overwrite=args.overwrite, hint="--overwrite")
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

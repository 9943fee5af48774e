"""``python -m rope.experiment --preset cpu``: run the extrapolation experiment, write its JSON."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from .methods import METHODS
from .presets import PRESETS
from .runner import run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rope.experiment",
        description="Train a small RoPE / ALiBi / NoPE transformer at a short context and evaluate "
        "context-extension methods at 1x to 16x the training length.",
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--output", default=None,
                        help="results JSON, with a markdown table beside it (.md) (default: "
                        "benchmarks/extrapolation_results.json for the cpu preset, the chapter's file; "
                        "benchmarks/extrapolation_results_<preset>.json otherwise; _seed<N> is appended "
                        "for a --seed other than the preset's)")
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
    suffix = "" if args.preset == "cpu" else f"_{args.preset}"
    if config.seed != PRESETS[args.preset].seed:
        suffix += f"_seed{config.seed}"
    output = args.output or f"benchmarks/extrapolation_results{suffix}.json"
    results = run(config, methods=args.methods, output=output, device=args.device,
                  progress=not args.no_progress)
    lengths = results["lengths"]
    print(f"{'method':<18}" + "".join(f"{'loss@' + str(n):>11}" for n in lengths)
          + "".join(f"{'acc@' + str(n):>10}" for n in lengths))
    for row in results["methods"].values():
        print(f"{row['label']:<18}" + "".join(f"{v:>11.3f}" for v in row["loss"])
              + "".join(f"{v:>10.3f}" for v in row["recall_accuracy"]))
    print(f"wrote {output} and its table {Path(output).with_suffix('.md')} ({results['wall_time_s']:.0f} s)")


if __name__ == "__main__":
    main()

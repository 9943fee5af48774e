"""Experiment settings and the three presets: ``tiny`` (seconds), ``cpu`` (minutes), ``gpu``.

Every number that shapes a result lives in :class:`ExperimentConfig` and is written into the
results file, so a results file says how it was made.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..checks import integer
from .data import TaskSpec


@dataclass(frozen=True)
class ExperimentConfig:
    """One run: the task, the model sizes, training, fine-tuning and evaluation."""

    name: str
    task: TaskSpec = field(default_factory=TaskSpec)
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    mlp_ratio: int = 4
    rope_theta: float = 10000.0
    training_length: int = 64
    steps: int = 1500
    batch_size: int = 32
    learning_rate: float = 1e-2
    warmup_steps: int = 100
    weight_decay: float = 0.01
    finetune_factor: int = 4
    finetune_steps: int = 100
    finetune_learning_rate: float = 1e-3
    eval_multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    eval_tokens: int = 8192
    eval_batch_tokens: int = 4096
    seed: int = 0
    threads: int | None = None

    def __post_init__(self):
        for key in ("d_model", "num_heads", "num_layers", "mlp_ratio", "training_length", "steps", "batch_size",
                    "finetune_factor", "finetune_steps", "eval_tokens", "eval_batch_tokens"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be a positive int, got {value!r}")
        if self.training_length < 4:
            raise ValueError(f"training_length must be >= 4 (ReRoPE's window is half of it), got {self.training_length}")
        if not self.eval_multiples or any(isinstance(m, bool) or not isinstance(m, int) or m < 1
                                          for m in self.eval_multiples):
            raise ValueError(f"eval_multiples must be a non-empty tuple of positive ints, got {self.eval_multiples!r}")
        integer("seed", self.seed, minimum=0)
        if self.threads is not None and (not isinstance(self.threads, int) or self.threads < 1):
            raise ValueError(f"threads must be None or a positive int, got {self.threads!r}")

    @property
    def eval_lengths(self) -> list[int]:
        return [m * self.training_length for m in self.eval_multiples]

    def to_dict(self) -> dict:
        out = asdict(self)
        out["eval_multiples"] = list(self.eval_multiples)
        return out


PRESETS: dict[str, ExperimentConfig] = {
    # Seconds on one thread: the chapter runs it live and the tests run it.
    "tiny": ExperimentConfig(
        name="tiny",
        task=TaskSpec(markov_vocab=16, successors=3, anchors=16, span=3),
        d_model=32, num_heads=2, num_layers=2, training_length=16,
        steps=40, batch_size=16, warmup_steps=5, finetune_steps=8,
        eval_tokens=512, eval_batch_tokens=1024, threads=1,
    ),
    # A few minutes on one CPU thread (more threads were slower on a shared 2-core machine):
    # the committed results file.
    "cpu": ExperimentConfig(name="cpu", threads=1),
    # A larger run for a GPU (Colab): longer training context, wider model, more evaluation tokens.
    "gpu": ExperimentConfig(
        name="gpu",
        task=TaskSpec(markov_vocab=128, successors=4, anchors=256, span=6),
        d_model=256, num_heads=8, num_layers=4, training_length=256,
        steps=4000, batch_size=64, learning_rate=1e-3, warmup_steps=200,
        finetune_steps=400, finetune_learning_rate=3e-4,
        eval_tokens=131072, eval_batch_tokens=8192,
    ),
}

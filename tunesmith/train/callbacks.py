"""Trainer callbacks: the loss-curve picture (training and evaluation loss) written at the end of a run, the metrics
file, and offloaded layers moved onto the side-stream copies."""

from __future__ import annotations

import json
import os
import tempfile
import time

from transformers import TrainerCallback

from ..constants import LOSS_PLOT_FILE, METRICS_FILE
from ..models.prompt_learning import load_encoder
from ..utils.events import emit
from ..utils.io import atomic_write_jsonl
from .layer_modes import LayerModes, checkpointed_layers, set_layer_modes


def logged_series(log_history: list[dict], keys: tuple[str, ...]) -> dict[str, list[tuple[int, float]]]:
    """{key: [(step, value), ...]} of each of `keys` logged at least once: the training records hold `loss`,
    the evaluations during training `eval_loss`."""
    series = {k: [(r["step"], r[k]) for r in log_history if k in r and "step" in r] for k in keys}
    return {k: v for k, v in series.items() if v}


def plot_loss(log_history: list[dict], path: str, keys: tuple[str, ...] = ("loss", "eval_loss"),
              ylabel: str = "loss") -> bool:
    """Write a PNG of the logged values of `keys` (the losses) against the step (atomically); False when
    nothing was logged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = logged_series(log_history, keys)
    if not series:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, points in series.items():
        ax.plot(*zip(*points), marker="." if len(points) < 50 else None, label=key)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(alpha=0.3)
    fd, tmp = tempfile.mkstemp(suffix=".png", dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    fig.savefig(tmp, dpi=100, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)
    return True


class LossPlotCallback(TrainerCallback):
    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            os.makedirs(args.output_dir, exist_ok=True)
            plot_loss(state.log_history, os.path.join(args.output_dir, LOSS_PLOT_FILE))


class MetricsFileCallback(TrainerCallback):
    """output_dir/metrics.jsonl: each logged record (training, evaluation) as one JSON line with its step,
    appended as it is logged, so a running job can be followed with `tail -f` and read without
    transformers. At the start it is rewritten from the trainer state: empty for a new run, and for a
    resumed one the records up to its checkpoint (a killed run's later lines would repeat).
    The step reached goes out as a `progress` event too (utils/events.py: to the web UI that runs the stage), at
    the start, at most once every PROGRESS_EVERY_S seconds, and at the last step."""

    PROGRESS_EVERY_S = 1.0

    def __init__(self) -> None:
        self.progress_sent = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            os.makedirs(args.output_dir, exist_ok=True)
            atomic_write_jsonl(os.path.join(args.output_dir, METRICS_FILE), state.log_history)
            self._progress(state)

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and (time.monotonic() - self.progress_sent >= self.PROGRESS_EVERY_S
                                            or state.global_step >= state.max_steps):
            self._progress(state)

    def _progress(self, state) -> None:
        self.progress_sent = time.monotonic()
        emit("progress", step=state.global_step, max_steps=state.max_steps)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, METRICS_FILE), "a", encoding="utf-8") as f:
                f.write(json.dumps({**logs, "step": state.global_step}, default=str) + "\n")


class OffloadOnSideStream(TrainerCallback):
    """--gradient_checkpointing offload on a GPU: transformers' checkpointing (enabled by train() before this runs)
    hands each layer's input to torch's save_on_cpu, whose copies wait on the compute stream; every checkpointed layer
    then takes train/layer_input_offload.py's instead (copies on a side stream, the layer below brought back ahead)."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        layers = checkpointed_layers(model)
        set_layer_modes(layers, LayerModes(0, 0, len(layers)), args.device.type)


class PromptEncoderLoader(TrainerCallback):
    """A p-tuning adapter's encoder (the MLP that training goes on with; PEFT's adapter file holds only its output),
    loaded from the resumed checkpoint once the Trainer has loaded the rest (on_train_begin comes after it, whatever
    the wrapping), and from the best checkpoint when the Trainer reloads that at the end (--load_best_model_at_end)."""

    def __init__(self) -> None:
        self.checkpoint: str | None = None  # set by the Trainer's train(resume_from_checkpoint=...)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.checkpoint is not None and model is not None:
            load_encoder(model, self.checkpoint)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if args.load_best_model_at_end and state.best_model_checkpoint is not None and model is not None:
            load_encoder(model, state.best_model_checkpoint)

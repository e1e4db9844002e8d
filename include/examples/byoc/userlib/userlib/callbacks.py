"""A Trainer callback that says, in the job's log, that the team's library is the one in use."""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback

MARKER = "userlib-marker"


class MarkerCallback(TrainerCallback):
    """One line when training starts (where userlib was imported from) and one per logged loss."""

    def on_train_begin(self, args, state, control, **kwargs):
        from userlib import __version__

        print(f"{MARKER}: userlib {__version__} from {Path(__file__).parent} at step {state.global_step}",
              flush=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            print(f"{MARKER}: step {state.global_step} loss {logs['loss']:.4f}", flush=True)

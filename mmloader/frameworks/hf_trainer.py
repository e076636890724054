"""Hugging Face ``transformers.Trainer`` over an mmloader loader, resumable from its checkpoints.

The Trainer builds its own DataLoader from a dataset and, on resume, skips the batches
already trained by reading them again. With mmloader the loader does the sharding and
resumes by arithmetic, so :func:`use_loader` hands the Trainer the loader, turns the
Trainer's own data skipping off, and stores the loader's state in every checkpoint::

    trainer = Trainer(model=model, args=TrainingArguments(...))
    use_loader(trainer, mmloader.loader(stream))
    trainer.train(resume_from_checkpoint=True)   # continues at the next unseen batch

With ``gradient_accumulation_steps`` that does not divide the epoch's batches, a resumed
epoch's last (shorter) accumulation group joins the next epoch's first optimizer step: the
Trainer restarts its step count in a resumed epoch when its own data skipping is off. Every
sample is still trained exactly once.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

try:
    from transformers import TrainerCallback
except ImportError as e:
    raise ImportError("mmloader.frameworks.hf_trainer needs transformers: pip install 'mmloader[transformers]'") from e

from ..errors import ResumeError

log = logging.getLogger("mmloader")
STATE_FILE = "mmloader-loader-rank{rank}.json"


def use_loader(trainer: Any, loader: Any) -> Any:
    """Make ``trainer`` train on ``loader``, with its state in the Trainer's checkpoints.

    Args:
        trainer: a ``transformers.Trainer`` (or subclass); made without a train dataset or with one.
        loader: an mmloader loader (:func:`mmloader.loader`, ``GPUDecode``...).

    Returns:
        The trainer.
    """
    trainer.get_train_dataloader = lambda: loader  # this instance only; the class is left alone
    if not trainer.args.ignore_data_skip:
        # The Trainer would re-read the trained batches through a DataLoader of its own; the
        # loader's state already resumes at the next unseen batch.
        trainer.args.ignore_data_skip = True
        log.info("mmloader: TrainingArguments.ignore_data_skip set to True (the loader's state resumes it)")
    trainer.add_callback(LoaderCheckpoint(loader))
    return trainer


class LoaderCheckpoint(TrainerCallback):
    """Saves the loader's state into each checkpoint folder; loads it when training resumes.

    One JSON file per data-parallel rank (``mmloader-loader-rank{r}.json``), beside the
    Trainer's own files. A resumed run whose checkpoint has no such file raises
    :class:`mmloader.errors.ResumeError` instead of restarting the epoch silently.

    Args:
        loader: the loader to save and restore.
        resume_from: the checkpoint folder to load from when it is not
            ``output_dir/checkpoint-<global step>`` (a checkpoint moved elsewhere).
    """

    def __init__(self, loader: Any, resume_from: str | os.PathLike | None = None):
        self.loader, self.resume_from = loader, resume_from

    def _file(self, folder: str | os.PathLike) -> Path:
        stream = getattr(self.loader, "stream", None)
        rank = stream.where()[0] if stream is not None else 0
        return Path(folder) / STATE_FILE.format(rank=rank)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        folder.mkdir(parents=True, exist_ok=True)
        path = self._file(folder)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.loader.state_dict()))
        os.replace(tmp, path)  # never a half-written state under the final name

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 0:
            return
        folder = self.resume_from or Path(args.output_dir) / f"checkpoint-{state.global_step}"
        path = self._file(folder)
        if not path.is_file() and (Path(folder) / STATE_FILE.format(rank=0)).is_file():
            # Resumed onto more ranks than saved: a state says where all ranks are (the ranks
            # step together), so rank 0's serves every rank of the new world.
            path = Path(folder) / STATE_FILE.format(rank=0)
        if not path.is_file():
            raise ResumeError(
                f"resuming at step {state.global_step}, but {path} does not exist: this checkpoint "
                "holds no mmloader loader state (give LoaderCheckpoint(resume_from=...) "
                "if the checkpoint was moved)"
            )
        self.loader.load_state_dict(json.loads(path.read_text()))
        log.info("mmloader: loader resumed from %s (epoch %s)", path, self.loader.epoch)
        _make_room_for_the_resumed_epoch(self.loader, args, state)


def _make_room_for_the_resumed_epoch(loader: Any, args: Any, state: Any) -> None:
    """Raise the Trainer's step budget when a resume onto more ranks needs it; refuse a resume the
    Trainer would count as another epoch.

    An epoch-based Trainer stops at ``num_train_epochs`` x its optimizer steps per epoch,
    counted from the global step, which includes the steps taken in the saved world. A rank of
    a larger world took more of those steps per sample than it takes now, so without room the
    last epoch would stop short, its last batches untrained."""
    stream = getattr(loader, "stream", None)
    if stream is None or not hasattr(stream, "epoch_length"):
        return
    accumulate = max(int(args.gradient_accumulation_steps), 1)
    per_epoch = max(-(-stream.epoch_length() // accumulate), 1)  # what the Trainer computed
    epoch = state.global_step // per_epoch  # the epoch the Trainer resumes in, by its own count
    finishing = epoch == loader.epoch - 1 and stream._finishing(epoch)  # saved at that epoch's end
    if epoch != loader.epoch and not finishing:
        raise ResumeError(
            f"the Trainer resumes at global step {state.global_step} as epoch {epoch} (it divides by this "
            f"world's {per_epoch} steps per epoch), but the checkpoint was saved in epoch {loader.epoch} on "
            f"another number of ranks, so it would train the wrong epoch: resume this checkpoint on the "
            f"number of ranks that saved it (a loader state resumes on any number within its first epoch)"
        )
    if args.max_steps > 0 or finishing:
        return  # a step budget the user chose is theirs; a finished epoch needs no room
    epochs = math.ceil(args.num_train_epochs)
    needed = state.global_step + -(-stream.remaining() // accumulate) + max(epochs - epoch - 1, 0) * per_epoch
    if needed > state.max_steps:
        log.info("mmloader: max_steps %d -> %d, for the rest of the resumed epoch", state.max_steps, needed)
        state.max_steps = needed

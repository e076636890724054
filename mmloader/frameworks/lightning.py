"""PyTorch Lightning: a DataModule over mmloader streams and a data-wait logging callback.

A loader returned by ``train_dataloader()`` works as it is: Lightning sets its epoch
through ``loader.sampler.set_epoch``, saves ``loader.state_dict()`` in its checkpoints
(``loops.fit_loop.state_dict.combined_loader``) and loads it when it resumes, mid-epoch
included. This module adds what Lightning users expect around that.

>>> dm = DataModule(lambda: mmloader.Stream(ds, batch_size=64), num_workers=4)   # doctest: +SKIP
>>> Trainer(strategy="ddp", callbacks=[DataWaitCallback()]).fit(model, dm)     # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any, Callable

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ImportError as e:
        raise ImportError("mmloader.frameworks.lightning needs Lightning: pip install 'mmloader[lightning]'") from e

from ..loading.config import from_config
from ..loading.dataloader import loader as make_loader
from ..loading.diagnosis import KEEPS_UP, advice
from ..loading.nodes.chain import copies
from ..loading.stream import Stream
from ..readers.timing import STAGES

log = logging.getLogger("mmloader")

StreamSource = Stream | Callable[[], Stream] | str


class DataModule(pl.LightningDataModule):
    """A ``LightningDataModule`` whose loaders are mmloader's.

    Each stream is made on first use, in the training process, after Lightning has set up
    DDP (so ranks are known; with ``ddp_spawn`` nothing heavy is pickled). One loader
    per stage is kept for the whole fit, so its position survives epochs and checkpoints.

    Args:
        train: the training data: a Stream, a function returning one, or an experiment
            config path (``mmloader.from_config``).
        val: validation data, the same kinds (optional).
        **loader_options: passed to :func:`mmloader.loader` (``num_workers``, ``backend``...);
            ``nodes=[...]`` go to the training loader, and copies of them to the validation one
            (a node reads from one loader).
    """

    def __init__(self, train: StreamSource, val: StreamSource | None = None, **loader_options: Any):
        super().__init__()
        self.sources: dict[str, StreamSource | None] = {"train": train, "val": val}
        self.loader_options = loader_options
        self.loaders: dict[str, Any] = {}
        self._states_to_load: dict[str, dict] = {}

    def _loader(self, stage: str) -> Any:
        if stage not in self.loaders:
            source = self.sources[stage]
            if isinstance(source, str):
                stream = from_config(source)
            elif isinstance(source, Stream):
                stream = source
            else:
                assert source is not None  # val_dataloader asks for "val" only when it was given
                stream = source()
            if not isinstance(stream, Stream):
                raise TypeError(f"DataModule({stage}=...) must give an mmloader.Stream, got {type(stream).__name__}")
            options = dict(self.loader_options)
            if stage != "train" and options.get("nodes"):
                options["nodes"] = copies(options["nodes"])
            loader = make_loader(stream, **options)
            if stage in self._states_to_load:  # a resume: loaded before Lightning reads len()
                loader.load_state_dict(self._states_to_load.pop(stage))
            self.loaders[stage] = loader
        return self.loaders[stage]

    def state_dict(self) -> dict[str, Any]:
        """The training loader's state, saved by Lightning in each checkpoint beside its own copy.

        Lightning reads ``len()`` of a loader before it loads the loader's state into it, and
        stops each epoch at that length; a resume onto more ranks takes more steps in its epoch
        than a fresh epoch there has. This copy is loaded when the loader is made, before
        Lightning reads the length, so the resumed epoch is delivered whole on any world size."""
        return {"loaders": {"train": self.loaders["train"].state_dict()}} if "train" in self.loaders else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the loader states of a checkpoint, for the loaders made after it (see :meth:`state_dict`)."""
        self._states_to_load = dict(state_dict.get("loaders", {}))
        for stage in list(self._states_to_load):
            if stage in self.loaders:  # made already: loaded now
                self.loaders[stage].load_state_dict(self._states_to_load.pop(stage))

    def train_dataloader(self) -> Any:
        """The training loader (made once)."""
        return self._loader("train")

    def val_dataloader(self) -> Any:
        """The validation loader (made once); none when no ``val`` was given."""
        return self._loader("val") if self.sources["val"] is not None else []

    def __getstate__(self) -> dict:
        # ddp_spawn pickles the module into each rank: loaders (workers, threads) stay behind.
        state = self.__dict__.copy()
        state["loaders"] = {}
        return state


class DataWaitCallback(pl.Callback):
    """Logs, every ``every_n_steps`` training steps, how long the step waited for data.

    Logged (through ``pl_module.log_dict``, so to whatever logger the Trainer has):
    ``data/wait_ms`` and ``data/compute_ms`` per batch, ``data/wait_fraction`` (near 0
    while data keeps up; the loader should be about 1.5x faster than the model),
    ``data/samples_per_s`` and ``data/ready_fraction``, and where the loader reports them
    the stages of building a batch (``data/read_ms``, ``data/decode_ms``,
    ``data/collate_ms``, per worker), over the interval since the last log. When data holds
    the loop up, what to do is logged once (and kept in :attr:`advice`), as
    :func:`mmloader.loading.diagnosis.advice` says it. The loaders found are those of
    ``trainer.train_dataloader`` that have ``stats()``.

    Args:
        every_n_steps: how often to log.
        prefix: the metric names' prefix.
    """

    def __init__(self, every_n_steps: int = 50, prefix: str = "data/"):
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps}: expected an integer >= 1")
        self.every_n_steps, self.prefix = every_n_steps, prefix
        self.last: dict[str, float] = {}
        self.advice = ""  # the last loader's finding (each loader's: in `findings`, by its place)
        self.findings: dict[int, str] = {}

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % self.every_n_steps:
            return
        for place, loader in enumerate(_stats_loaders(trainer.train_dataloader)):
            figures = loader.stats(reset=True)
            self.last = figures
            logged = {
                f"{self.prefix}wait_ms": figures["wait_ms_per_batch"],
                f"{self.prefix}compute_ms": figures["compute_ms_per_batch"],
                f"{self.prefix}wait_fraction": figures["wait_fraction"],
                f"{self.prefix}samples_per_s": figures["samples_per_s"],
                f"{self.prefix}ready_fraction": figures.get("ready_fraction", 0.0),
            }
            logged.update(
                {f"{self.prefix}{s}_ms": figures[f"{s}_ms_per_batch"] for s in STAGES if f"{s}_ms_per_batch" in figures}
            )
            said = advice(figures)
            found = said.split(":")[0]  # what was found, without the interval's figures
            if figures["wait_fraction"] >= KEEPS_UP and found != self.findings.get(place):
                log.warning("mmloader: %s", said)  # once per finding and loader, not every interval
            self.findings[place] = found
            self.advice = said
            pl_module.log_dict(
                logged,
                on_step=True,
                on_epoch=False,
                batch_size=1,
            )


def _stats_loaders(loaders: Any) -> list:
    """The loaders with ``stats()`` in what Lightning holds (one, or a list/dict of them)."""
    if hasattr(loaders, "stats"):
        return [loaders]
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return [x for item in loaders for x in _stats_loaders(item)]
    return []

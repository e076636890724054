"""Integrations with training frameworks, each behind its own extra.

* :mod:`mmloader.frameworks.lightning`: a ``LightningDataModule`` and a callback that
  logs how long training waits for data (``pip install mmloader[lightning]``).
* :mod:`mmloader.frameworks.hf_trainer`: ``use_loader(trainer, loader)`` for
  ``transformers.Trainer``, with the loader's state in its checkpoints
  (``pip install mmloader[transformers]``).
* :mod:`mmloader.frameworks.torchft`: ``QuorumLoader``, each step's batches dealt to the
  quorum of a fault-tolerant (torchft) job, every sample once in the committed steps
  (``pip install mmloader[torchft]``).

accelerate needs no module: ``Accelerator.prepare`` leaves mmloader's loaders as they
are (they are not ``DataLoader`` instances, so it does not re-shard them), and
``accelerator.register_for_checkpointing(loader)`` puts their state in ``save_state``.
Nothing here is imported by ``import mmloader``.
"""

from .. import _submodules_on_access

__getattr__ = _submodules_on_access(__name__)

"""A PyTorch Lightning script with Ravex as its checkpoint plugin: ``Trainer(plugins=[RavexCheckpointIO])``,
``ModelCheckpoint(save_last=True)`` every few steps, resumed with Lightning's own ``ckpt_path="last"``.

Prints ``START <global_step>`` once fit has restored what it resumes, ``STEP <global_step> W<step>``
after every training batch, ``<step>`` being the global step of the checkpoint ``last.ckpt`` names
(its pointer is written once its Ravex step is durable; a test SIGKILLs once it is far enough), and at the end
``STATS <new chunks> <reused chunks>`` of every save this run wrote, and the final weights to
``$T_OUT``. ``T_MODE``: ``async`` (default, the plugin's background writes), ``sync``, ``plain``
(no plugin, no checkpoints: the reference run) or ``zero`` (no Ravex in the code, Lightning's
defaults: run under ``ravex enable``).

``T_PKG=pytorch_lightning``: the standalone package instead of ``lightning``. ``T_DEVICES=2``: DDP on
two CPU processes (gloo; Lightning gives the shuffled loader a ``DistributedSampler``), with
dropout seeded differently on each rank; only rank 0 prints ``START``/``STEP``, every rank prints
``BATCH <rank> <global_step> <sample indices>``. Rank 0 prints ``LOSS <global_step> <loss>`` (the
float's ``repr``). ``T_AFTER=1``: after ``fit`` the script also writes ``trainer.save_checkpoint``
to ``after.ckpt``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import sys
from pathlib import Path

import torch

PKG = os.environ.get("T_PKG", "lightning")
L = importlib.import_module("pytorch_lightning" if PKG == "pytorch_lightning" else "lightning")
ModelCheckpoint = importlib.import_module(
    "pytorch_lightning.callbacks" if PKG == "pytorch_lightning" else "lightning.pytorch.callbacks").ModelCheckpoint

SAMPLES, BATCH, EPOCHS, EVERY = 64, 4, 3, 4  # 16 steps per epoch, 48 in all (8 and 24 on two ranks)
MODE = os.environ.get("T_MODE", "async")
DEVICES = int(os.environ.get("T_DEVICES", "1"))
BLOCK_AT = int(os.environ.get("T_BLOCK_AT", "0") or 0)  # zero-code: flush, say BLOCKED, wait to be killed


class ResumableLoader(torch.utils.data.DataLoader):  # type: ignore[type-arg]
    """A DataLoader Lightning can resume mid-epoch (its ``state_dict``/``load_state_dict``
    interface): each epoch's order is a seeded permutation, and the batches already handed
    out this epoch are skipped when resumed."""

    def __init__(self, dataset: torch.utils.data.Dataset, batch_size: int) -> None:  # type: ignore[type-arg]
        super().__init__(dataset, batch_size=batch_size)
        self.epoch, self.handed, self._skip = 0, 0, 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(100 + self.epoch))
        skip, self._skip, self.handed = self._skip, 0, self._skip
        for idx in order.split(self.batch_size)[skip:]:
            self.handed += 1
            yield self.collate_fn([self.dataset[int(j)] for j in idx])
        self.epoch, self.handed = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        if self.handed >= len(self):  # the epoch's last batch is out: resume at the next epoch
            return {"epoch": self.epoch + 1, "handed": 0}
        return {"epoch": self.epoch, "handed": self.handed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self._skip = state["epoch"], state["handed"]


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        dropout = [torch.nn.Dropout(0.25)] if DEVICES > 1 else []  # each rank its own RNG: resumed per rank
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), *dropout, torch.nn.Linear(32, 1))
        self.frozen = torch.nn.Linear(8, 8)  # never trained: each save reuses its chunks
        self.frozen.requires_grad_(False)
        self.save_hyperparameters({"width": 32, "lr": 1e-2, "betas": (0.9, 0.99)})

    def setup(self, stage: str) -> None:
        if DEVICES > 1:
            torch.manual_seed(1000 + self.global_rank)  # the ranks' dropout masks differ

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y, _ = batch
        return torch.nn.functional.mse_loss(self.net(self.frozen(x)), y)

    def on_train_start(self) -> None:
        if self.global_rank == 0:
            _say(f"START {self.trainer.global_step}")

    def on_train_batch_end(self, outputs: dict[str, torch.Tensor], batch: list[torch.Tensor], batch_idx: int) -> None:
        step = self.trainer.global_step
        if DEVICES > 1:
            _say(f"BATCH {self.global_rank} {step} {','.join(str(int(i)) for i in batch[2])}")
        if self.global_rank == 0:
            _say(f"LOSS {step} {float(outputs['loss'])!r}")
            _say(f"STEP {step} W{_written()}")
        if BLOCK_AT == step and MODE == "zero" and self.global_rank == 0:
            self.trainer.strategy.checkpoint_io.ravex.flush()  # every queued write durable: saves, witnesses
            _say("BLOCKED")
            sys.stdin.read()  # the test SIGKILLs us here

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        opt = torch.optim.AdamW(self.net.parameters(), lr=1e-2, betas=(0.9, 0.99))
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)}


def _say(line: str) -> None:
    """One line in one write: the ranks share the pipe, and a print's text and newline are two."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _written() -> int | None:
    """The global step of the newest durable checkpoint: the one ``ckpts/last.ckpt`` names, or
    under ``ravex enable`` the newest ``step=N.ckpt`` in ``.ravex/`` (the plugin writes a pointer
    once its step is durable)."""
    if MODE == "zero":
        return max((int(p.stem.split("=")[1]) for p in Path(".ravex").glob("lightning-*/step=*.ckpt")), default=None)
    try:
        with open(os.path.join("ckpts", "last.ckpt")) as f:
            return int(json.load(f)["global_step"])
    except FileNotFoundError:
        return None


def main() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    data = torch.utils.data.TensorDataset(torch.randn(SAMPLES, 8, generator=g), torch.randn(SAMPLES, 1, generator=g),
                                          torch.arange(SAMPLES))
    if os.environ.get("T_LOADER") == "plain":  # what most scripts have: Lightning cannot resume it mid-epoch
        loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)
    else:
        loader = ResumableLoader(data, BATCH)
    options: dict[str, object] = {"enable_checkpointing": MODE == "zero"}
    io = None
    if MODE in ("async", "sync"):
        from ravex.integrations.lightning import RavexCheckpointIO

        io = RavexCheckpointIO("./store", async_writes=MODE == "async")
        options = {"plugins": [io],
                   "callbacks": [ModelCheckpoint(dirpath="ckpts", save_last=True, every_n_train_steps=EVERY)]}
    if DEVICES > 1:
        options["strategy"] = "ddp"
    trainer = L.Trainer(max_epochs=EPOCHS, accelerator="cpu", devices=DEVICES, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, **options)  # type: ignore[arg-type]
    model = Net()
    trainer.fit(model, loader, ckpt_path="last" if io is not None else None)
    if os.environ.get("T_AFTER"):
        trainer.save_checkpoint("after.ckpt")
    if not trainer.is_global_zero:
        return
    if MODE == "zero":
        io = trainer.strategy.checkpoint_io  # the plugin Ravex gave the Trainer under `ravex enable`
        _say(f"IO {type(io).__name__}")
        # what a later trainer.test() without ckpt_path would load, and the signature LightningCLI reads
        _say(f"CKPT_PATH {trainer.ckpt_path}")
        _say("SIGNATURE " + ",".join(list(inspect.signature(type(trainer).__init__).parameters)[1:4]))
    if io is not None:
        new, reused = ([getattr(s, name) for s in io.stats] for name in ("new_chunks", "reused_chunks"))
        _say(f"STATS {json.dumps(new, separators=(',', ':'))} {json.dumps(reused, separators=(',', ':'))}")
    torch.save({"model": model.state_dict(), "global_step": trainer.global_step}, os.environ["T_OUT"])
    _say("DONE")


if __name__ == "__main__":
    main()

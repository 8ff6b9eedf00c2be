"""PyTorch Lightning with its checkpoints in a Ravex store: ``RavexCheckpointIO`` as a plugin.

    pip install 'ravex[lightning]'
    python examples/lightning_checkpointio.py      # kill it mid-way, then run it again

``ModelCheckpoint`` decides when to save, as always; the plugin writes each checkpoint (the whole
dict: weights, optimizer, schedulers, loop progress, callbacks) as a Ravex step of ``./pl-store``,
a delta on the one before, on a background thread, and leaves a small pointer file at the path
Lightning named (``pl-ckpts/last.ckpt``). ``ckpt_path="last"`` resumes from it. Then
``ravex ls ./pl-store``, ``ravex diff`` and ``ravex inspect ./pl-store`` read what Lightning saved.
"""

from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from ravex.integrations.lightning import RavexCheckpointIO


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(2048, 16, generator=g), torch.randn(2048, 1, generator=g))
    trainer = L.Trainer(
        max_epochs=5, accelerator="cpu", logger=False, enable_progress_bar=False,
        plugins=[RavexCheckpointIO("./pl-store")],
        callbacks=[ModelCheckpoint(dirpath="pl-ckpts", save_last=True, every_n_train_steps=20)],
    )
    trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=32), ckpt_path="last")


if __name__ == "__main__":
    main()

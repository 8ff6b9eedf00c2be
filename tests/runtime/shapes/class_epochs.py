"""A Keras-like ``fit()`` of a trainer class in its own module (shape_trainer.py): the epoch
and the global step are attributes, the step counted inside a method."""

from probe import entry, finish

entry()

import torch  # noqa: E402
from shape_trainer import EpochTrainer  # noqa: E402
from torch import nn  # noqa: E402

torch.manual_seed(7)
x = torch.randn(48, 10)
y = (x[:, 0] > 0).long()
model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))
trainer = EpochTrainer(model, x, y, epochs=5, batch=8)
trainer.fit()
finish(model=model.state_dict(), optimizer=trainer.opt.state_dict(), scheduler=trainer.sched.state_dict(),
       epoch=trainer.epoch, global_step=trainer.global_step)

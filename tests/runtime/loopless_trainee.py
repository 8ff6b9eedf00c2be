"""A small loop run by ``test_unrestored_resume.py``, in the shapes of a rerun that never restores.

``argv[1]`` is the shape:

``train``     ``for epoch in range(EPOCHS)`` over a DataLoader of 4 batches, one optimizer step
              per batch; prints ``STEP <n>``
``noforward`` builds the model and optimizer under Ravex, then exits: no forward, no step
``framework`` a library's loop (``framework_loop.fit``), as a framework runs it: an epoch that
              yields no batch is taken for empty data, the loop stops, and the model is saved
              (``model.pt``)
``save``      builds the model and optimizer, then saves the model (``model.pt``): no forward,
              no step

``T_OUT_FEATURES`` (default 1) is the model's output width: another one is a changed model.

Each prints ``RESUME <ravex.status()["resume"]>`` last.

``argv[2]`` is EPOCHS (default 1); ``argv[3]``, if given, is a step after which the run flushes
Ravex and ends at once with ``os._exit(0)``: a kill there, with its checkpoints complete and no
exit checkpoint.
"""

import os
import sys

import ravex

ravex.activate()

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

SHAPE = sys.argv[1]
EPOCHS = int(sys.argv[2]) if len(sys.argv) > 2 else 1
DIE_AT = int(sys.argv[3]) if len(sys.argv) > 3 else None

torch.manual_seed(0)
OUT = int(os.environ.get("T_OUT_FEATURES", "1"))
model = torch.nn.Linear(4, OUT)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(16, 4), torch.randn(16, OUT))
loader = DataLoader(data, batch_size=4)

if SHAPE == "noforward":
    print(f"RESUME {ravex.status()['resume']}", flush=True)
    sys.exit(0)

if SHAPE == "save":
    torch.save(model.state_dict(), "model.pt")
    print(f"RESUME {ravex.status()['resume']}", flush=True)
    sys.exit(0)

if SHAPE == "framework":
    import framework_loop

    framework_loop.fit(model, optimizer, loader, EPOCHS, DIE_AT)
    torch.save(model.state_dict(), "model.pt")
    print(f"RESUME {ravex.status()['resume']}", flush=True)
    sys.exit(0)

step = 0
for _epoch in range(EPOCHS):
    batches = 0
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        step += 1
        batches += 1
        print(f"STEP {step}", flush=True)
        if step == DIE_AT:
            ravex.flush()
            os._exit(0)
print(f"RESUME {ravex.status()['resume']}", flush=True)

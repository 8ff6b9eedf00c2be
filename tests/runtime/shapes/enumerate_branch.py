"""pytorch/examples dcgan's shape: a module-level epoch loop over
``enumerate(dataloader, 0)``, two optimizers stepped per batch, BatchNorm, a branch on the
batch index that runs the generator (in training mode: its running statistics move) and
a ``torch.save`` of each network into the user's own file per epoch."""

from probe import done_step, entry, finish, say

entry()

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

NZ, EPOCHS = 6, 2
torch.manual_seed(1)
dataset = TensorDataset(torch.randn(96, 10, generator=torch.Generator().manual_seed(2)))
dataloader = DataLoader(dataset, batch_size=8, shuffle=True)
netG = nn.Sequential(nn.Linear(NZ, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))
netD = nn.Sequential(nn.Linear(10, 16), nn.BatchNorm1d(16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
criterion = nn.BCEWithLogitsLoss()
fixed_noise = torch.randn(8, NZ)
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))

for epoch in range(EPOCHS):
    for i, data in enumerate(dataloader, 0):
        real = data[0]
        netD.zero_grad()
        errD_real = criterion(netD(real), torch.ones(real.size(0), 1))
        errD_real.backward()
        fake = netG(torch.randn(real.size(0), NZ))
        errD_fake = criterion(netD(fake.detach()), torch.zeros(real.size(0), 1))
        errD_fake.backward()
        optimizerD.step()
        netG.zero_grad()
        errG = criterion(netD(fake), torch.ones(real.size(0), 1))
        errG.backward()
        optimizerG.step()
        say(f"STEP {epoch} {i} {(errD_real + errD_fake).item().hex()} {errG.item().hex()}")
        if i % 5 == 0:
            fake = netG(fixed_noise)
        done_step()
    torch.save(netG.state_dict(), f"netG_epoch_{epoch}.pth")
    torch.save(netD.state_dict(), f"netD_epoch_{epoch}.pth")

finish(netG=netG.state_dict(), netD=netD.state_dict(), optimizerD=optimizerD.state_dict(),
       optimizerG=optimizerG.state_dict())

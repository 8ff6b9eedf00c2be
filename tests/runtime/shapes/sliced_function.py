"""pytorch/examples word_language_model's shape with ``--use-optimizer``: the epoch loop
at module level inside ``try``, ``train()`` slicing batches by hand over
``enumerate(range(0, n, bptt))`` with the hidden state carried across batches (detached),
a per-epoch evaluation and the learning rate a global cut by hand when validation does not
improve. ``T_PRESLICED=1`` instead iterates a list of tensor batches, whose position no
variable tells: Ravex cannot find it by itself (the one-line ``ravex.loop`` does)."""

import os

from probe import done_step, entry, finish, say

entry()

import torch  # noqa: E402
from torch import nn  # noqa: E402

import ravex  # noqa: E402

PRESLICED = os.environ.get("T_PRESLICED") == "1"
loop = ravex.loop if os.environ.get("T_LOOP") == "1" else (lambda iterable: iterable)
EPOCHS, BPTT, BATCH, VOCAB = 3, 5, 4, 32
torch.manual_seed(0)
corpus = torch.randint(0, VOCAB, (600,), generator=torch.Generator().manual_seed(7))


def batchify(data, bsz):
    n = data.size(0) // bsz
    return data[: n * bsz].view(bsz, -1).t().contiguous()


train_data = batchify(corpus[:480], BATCH)
val_data = batchify(corpus[480:], BATCH)


def get_batch(source, i):
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, 16)
        self.drop = nn.Dropout(0.2)
        self.rnn = nn.LSTM(16, 16)
        self.decoder = nn.Linear(16, VOCAB)

    def forward(self, x, hidden):
        out, hidden = self.rnn(self.drop(self.encoder(x)), hidden)
        return torch.log_softmax(self.decoder(self.drop(out)), dim=-1).view(-1, VOCAB), hidden

    def init_hidden(self, bsz):
        return (torch.zeros(1, bsz, 16), torch.zeros(1, bsz, 16))


model = RNNModel()
criterion = nn.NLLLoss()
lr = 0.01
optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
batches = [get_batch(train_data, i) for i in range(0, train_data.size(0) - 1, BPTT)]


def train(epoch):
    model.train()
    total_loss = 0.0
    hidden = model.init_hidden(BATCH)
    steps = loop(enumerate(batches)) if PRESLICED else loop(enumerate(range(0, train_data.size(0) - 1, BPTT)))
    for batch, item in steps:  # the training loop
        data, targets = item if PRESLICED else get_batch(train_data, item)
        optimizer.zero_grad()
        hidden = tuple(h.detach() for h in hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        total_loss += loss.item()
        say(f"STEP {epoch} {batch} {loss.item().hex()} {total_loss.hex()}")
        done_step()


def evaluate(source):
    model.eval()
    total = 0.0
    hidden = model.init_hidden(BATCH)
    with torch.no_grad():
        for i in range(0, source.size(0) - 1, BPTT):
            data, targets = get_batch(source, i)
            output, hidden = model(data, hidden)
            total += len(data) * criterion(output, targets).item()
    return total / (len(source) - 1)


best_val_loss = None
try:
    for epoch in loop(range(1, EPOCHS + 1)):
        train(epoch)
        val_loss = evaluate(val_data)
        say(f"EPOCH {epoch} {val_loss.hex()} {lr}")
        if best_val_loss is None or val_loss < best_val_loss:
            best_val_loss = val_loss
        else:
            lr /= 4.0
            for group in optimizer.param_groups:
                group["lr"] = lr
except KeyboardInterrupt:
    say("exiting early")

finish(model=model.state_dict(), optimizer=optimizer.state_dict(), lr=lr, best_val_loss=best_val_loss)

"""Trainer classes in a module of their own, as libraries of training code write them: the
loop is a method, its counters live on ``self``, and the main script only builds the parts
and calls ``run()`` / ``fit()`` (class_trainer.py, class_epochs.py)."""

import logging

import torch
from probe import done_step, say
from torch.nn import functional as F
from torch.utils.data import DataLoader, RandomSampler


class Trainer:
    """minGPT's shape: the optimizer built inside ``run()``, ``self.iter_num`` reset to 0 at
    its top, batches drawn by ``next()`` from an endless random sampler in a ``while True:``,
    and a callback after every step that reads the counters off the trainer."""

    def __init__(self, model, dataset, max_iters, callback):
        self.model = model
        self.dataset = dataset
        self.max_iters = max_iters
        self.callback = callback

    def run(self):
        model = self.model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
        sampler = RandomSampler(self.dataset, replacement=True, num_samples=10**9)
        loader = DataLoader(self.dataset, sampler=sampler, batch_size=4)
        model.train()
        self.iter_num = 0
        data_iter = iter(loader)
        while True:
            try:
                batch = next(data_iter)
            except StopIteration:
                data_iter = iter(loader)
                batch = next(data_iter)
            x, y = batch
            logits = model(x)
            self.loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            model.zero_grad(set_to_none=True)
            self.loss.backward()
            self.optimizer.step()
            self.callback(self)
            self.iter_num += 1
            if self.iter_num >= self.max_iters:
                break


class EpochTrainer:
    """A Keras-like ``fit()``: a ``while`` over ``self.epoch``, the step counter advanced by a
    method (``train_step``), an LR scheduler stepped and the best model saved at epoch end."""

    def __init__(self, model, x, y, epochs, batch):
        self.model, self.x, self.y = model, x, y
        self.epochs, self.batch = epochs, batch
        self.epoch = 0
        self.global_step = 0
        self.best = float("inf")

    def train_step(self, xb, yb):
        loss = F.cross_entropy(self.model(xb), yb)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.global_step += 1
        return loss

    def evaluate(self):
        with torch.no_grad():
            val = F.cross_entropy(self.model(self.x[:16]), self.y[:16]).item()
        say(f"EVAL {self.epoch} {val.hex()}")
        if val < self.best:
            self.best = val
            torch.save(self.model.state_dict(), f"best_{self.epoch}.pt")

    def fit(self):
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=1, gamma=0.7)
        n = len(self.x)
        while self.epoch < self.epochs:
            perm = torch.randperm(n)
            for i in range(0, n, self.batch):
                idx = perm[i:i + self.batch]
                loss = self.train_step(self.x[idx], self.y[idx])
                say(f"STEP {self.global_step} {loss.item().hex()}")
                done_step()
            self.sched.step()
            self.evaluate()
            self.epoch += 1


class SnapshotTrainer:
    """pytorch/examples' minGPT-ddp shape: ``for epoch in range(self.epochs_run, ...)`` whose
    body first does ``epoch += 1`` (the variable is not the item any more), an epoch method
    drawing a shuffled DataLoader through ``enumerate``, and the script's own snapshot of the
    finished training, which it loads itself when it starts. With ``save_every`` it also saves
    its snapshot every that many epochs, and with ``evaluate`` it runs an evaluation loader after
    each epoch, as minGPT-ddp does: a Ravex checkpoint due at an epoch's last step is then taken
    in the evaluation, after the script's own snapshot of that epoch, and the rerun's loop
    (resumed by the script from that snapshot) starts past the recorded position."""

    def __init__(self, model, dataset, max_epochs, snapshot="snapshot.pt", save_every=0, evaluate=None):
        self.model, self.max_epochs, self.snapshot = model, max_epochs, snapshot
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        self.loader = DataLoader(dataset, batch_size=4, shuffle=True)
        self.save_every = save_every
        self.eval_loader = DataLoader(evaluate, batch_size=4) if evaluate is not None else None
        self.epochs_run = 0
        try:
            saved = torch.load(snapshot, weights_only=True)
        except FileNotFoundError:
            return
        model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.epochs_run = saved["epoch"]

    def _run_epoch(self, epoch):
        for i, (x, y) in enumerate(self.loader):
            logits = self.model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            say(f"STEP {epoch} {i} {loss.item().hex()}")
            done_step()

    def _evaluate(self, epoch):
        with torch.no_grad():
            losses = [F.cross_entropy(self.model(x).view(-1, 20), y.view(-1)) for x, y in self.eval_loader]
        say(f"EVAL {epoch} {torch.stack(losses).mean().item().hex()}")

    def train(self):
        for epoch in range(self.epochs_run, self.max_epochs):
            epoch += 1
            self._run_epoch(epoch)
            if epoch == self.max_epochs or (self.save_every and epoch % self.save_every == 0):
                torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                            "epoch": epoch}, self.snapshot)
            if self.eval_loader is not None:
                self._evaluate(epoch)


def prefetched(loader):
    """A prefetcher as image-classification trainers write one: the next batch is fetched
    before the current one is handed out (one ahead), from a generator of the user's module."""
    it = iter(loader)
    ready = next(it, None)
    while ready is not None:
        upcoming = next(it, None)
        yield ready
        ready = upcoming


def train_one_epoch(epoch, model, loader, opt, num_updates):
    """timm's ``train_one_epoch`` shape: ``enumerate`` over the prefetcher, an update counter that
    sets a per-update learning rate, and a running mean of the loss; the counter comes back."""
    loss_sum, seen = 0.0, 0
    for batch_idx, (x, y) in enumerate(prefetched(loader)):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        num_updates += 1
        for group in opt.param_groups:
            group["lr"] = 0.1 / (1 + 0.05 * num_updates)
        loss_sum += loss.item()
        seen += 1
        say(f"STEP {epoch} {batch_idx} {num_updates} {(loss_sum / seen).hex()} {loss.item().hex()}")
        logging.getLogger("train").info("update %d loss %s", num_updates, loss.item().hex())
        done_step()
    return num_updates, loss_sum / seen


def evaluate(model, loader):
    """The evaluation after each epoch, under ``no_grad`` over a loader of its own: its ``next()``
    is no place for the checkpoint the epoch's last step made due."""
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in loader:
            correct += int((model(x).argmax(1) == y).sum())
    model.train()
    return correct

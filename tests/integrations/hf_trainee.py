"""A HuggingFace Trainer script as a user writes it, with no Ravex in it: a tiny GPT-2 from
``GPT2Config`` on random tokens, ``max_steps=60`` (``$T_MAX_STEPS``) over two epochs, Trainer's
own checkpointing off, the model saved to ``final/`` and evaluated once trained. Under ``ravex
enable`` + ``ravex.yaml`` a rerun must resume it exactly, and a rerun of a finished run must train
nothing and save and evaluate the trained model. Runs as one process or under ``torchrun``.

Prints ``STEP <global_step> <epoch> W<step>`` after every optimizer step, ``<step>`` being the
newest checkpoint Ravex has written when it runs (a test SIGKILLs once that one is far enough; at
step ``$T_FLUSH_AT`` the callback first waits for what Ravex is writing, ``ravex.flush()``, so that
the kill comes however slowly the machine writes) and,
at the end, rank 0 writes the final weights, Trainer's log history and the evaluation's loss to
``$T_OUT`` (``torch.save``).
"""

from __future__ import annotations

import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

SAMPLES, SEQ, VOCAB, BATCH = 120, 16, 64, 4  # 30 steps per epoch (15 a rank under torchrun x2)
MAX_STEPS = int(os.environ.get("T_MAX_STEPS", "60"))
FLUSH_AT = int(os.environ.get("T_FLUSH_AT", "0"))


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, VOCAB, (SAMPLES, SEQ), generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Report(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        ravex = sys.modules.get("ravex")  # loaded by `ravex enable`'s autoloader, never imported here
        if ravex is not None and state.global_step == FLUSH_AT:
            ravex.flush()
        written = ravex.status().get("last_written_step") if ravex is not None else None
        print(f"STEP {state.global_step} {state.epoch:.4f} W{written}", flush=True)


def main() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir="out", max_steps=MAX_STEPS, per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=int(os.environ.get("T_ACCUM", "1")),
        learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=5, save_strategy="no",
        logging_steps=1, report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Report()])
    trainer.train()
    trainer.save_model("final")
    metrics = trainer.evaluate(eval_dataset=Tokens())
    logs = [{k: e[k] for k in ("step", "epoch", "loss", "learning_rate", "grad_norm")}
            for e in trainer.state.log_history if "loss" in e]
    if trainer.is_world_process_zero():
        torch.save({"model": model.state_dict(), "logs": logs, "global_step": trainer.state.global_step,
                    "epoch": trainer.state.epoch, "eval_loss": metrics["eval_loss"]}, os.environ["T_OUT"])
    print("DONE", flush=True)


if __name__ == "__main__":
    main()

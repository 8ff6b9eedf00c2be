"""HuggingFace Trainer, resumed exactly by Ravex with no Ravex code in the script.

    pip install 'ravex[hf]'
    ravex enable                                   # once per environment
    printf 'storage: ./hf-ckpt\ncheckpoint_every: 10\n' > ravex.yaml
    python examples/hf_trainer.py                  # Ctrl-C or kill it mid-way, then run it again

The rerun continues at the checkpoint: Trainer's global step, epoch, LR schedule, log history
and data order go on as if it had never stopped, and the final weights equal an uninterrupted
run's bit for bit. Trainer's own checkpointing stays off (`save_strategy="no"`). A tiny GPT-2
from its config on random tokens, so it runs on a CPU in seconds and downloads nothing.
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, samples: int = 256, length: int = 32, vocab: int = 128) -> None:
        self.ids = torch.randint(0, vocab, (samples, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2))
    args = TrainingArguments(output_dir="hf-out", max_steps=200, per_device_train_batch_size=8,
                             learning_rate=1e-3, warmup_steps=20, save_strategy="no", logging_steps=20,
                             report_to="none", use_cpu=True, seed=0)
    Trainer(model=model, args=args, train_dataset=RandomTokens()).train()


if __name__ == "__main__":
    main()

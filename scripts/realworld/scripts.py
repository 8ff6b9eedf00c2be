"""The scripts under test: where their sources come from, their tiny data, their commands.

Each entry builds a template directory (sources copied, data written here, seeded, so every run of
every checkout sees the same bytes) and says the command, the working directory inside the
template, what to parse from the output and which ravex.yaml to use.

Sources are copied unchanged, except the few CPU/gloo edits of the torchrun scripts listed in
PATCHES (exact text replacements applied to the copy at build time; the source dir is untouched).

Optional keys of an entry: nproc (ranks under torchrun, or started by torch.multiprocessing.spawn
with spawned=True: per-rank dumps, a step is complete when every rank's manifest is there),
pythonpath (folders, relative to the run directory, put on PYTHONPATH after the instrumentation),
seed (RS_SEED: the instrumentation calls torch.manual_seed right after `import torch`, for a script
that seeds nothing), rename ((regex, replacement) applied
to output file paths and to strings inside .pt files before comparing, for run ids made of the
clock), env (variables set for every run of the script), extend (the extension check: a finished
run rerun with a larger bound): a dict of bound (text, "B1→B2"), steps (the optimizer steps B2 adds to
B1), cmd2 (the command with bound B2; default: the B1 command), and optionally cmd (the B1 command,
default: the entry's cmd) and edit (a function of the run directory that raises the bound where the
script keeps it in a file; applied before the B2 runs).
"""

import os
import pickle
import shutil
import struct

import numpy as np

# SRC/nanoGPT (karpathy/nanoGPT), SRC/examples (pytorch/examples), SRC/minGPT (karpathy/minGPT),
# SRC/pytorch-template (victoresque/pytorch-template); harness.py sets it from --src.
SRC = os.environ.get("RAVEX_RS_SRC", "src")


def _raised(cmd, old, new):
    """cmd with its bound flag ``old`` replaced by ``new`` (each must occur: the command moved on)."""
    if old not in cmd:
        raise RuntimeError(f"extend: {old!r} is not in {cmd!r}")
    return cmd.replace(old, new)


def _copy(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("wikitext-2", "__pycache__", "*.png", "*.jpg", "*.ipynb"))


def nanogpt(tpl):
    _copy(f"{SRC}/nanoGPT", f"{tpl}/nanoGPT")
    d = f"{tpl}/nanoGPT/data/rs"
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(0)
    # the layout data/shakespeare_char/prepare.py writes: uint16 token ids, meta.pkl with vocab_size
    rng.integers(0, 65, 20000, dtype=np.uint16).tofile(f"{d}/train.bin")
    rng.integers(0, 65, 4000, dtype=np.uint16).tofile(f"{d}/val.bin")
    with open(f"{d}/meta.pkl", "wb") as fh:
        pickle.dump({"vocab_size": 65, "itos": {i: chr(48 + i) for i in range(65)},
                     "stoi": {chr(48 + i): i for i in range(65)}}, fh)
    return "nanoGPT"


def _idx(path, magic, arr):
    with open(path, "wb") as fh:
        fh.write(struct.pack(">I", magic))
        for n in arr.shape:
            fh.write(struct.pack(">I", n))
        fh.write(arr.astype(np.uint8).tobytes())


def _mnist_raw(root):
    """1600/500 random 28x28 images as MNIST idx files where datasets.MNIST(root) looks for them."""
    raw = f"{root}/MNIST/raw"
    os.makedirs(raw, exist_ok=True)
    rng = np.random.default_rng(1)
    for prefix, n in (("train", 1600), ("t10k", 500)):
        _idx(f"{raw}/{prefix}-images-idx3-ubyte", 2051, rng.integers(0, 256, (n, 28, 28)))
        _idx(f"{raw}/{prefix}-labels-idx1-ubyte", 2049, rng.integers(0, 10, (n,)))


def mnist(tpl):
    _copy(f"{SRC}/examples/mnist", f"{tpl}/mnist")
    _mnist_raw(f"{tpl}/data")  # main.py opens datasets.MNIST('../data')
    return "mnist"


def dcgan(tpl):
    _copy(f"{SRC}/examples/dcgan", f"{tpl}/dcgan")
    os.makedirs(f"{tpl}/dcgan/out", exist_ok=True)
    return "dcgan"


def wlm(tpl):
    _copy(f"{SRC}/examples/word_language_model", f"{tpl}/word_language_model")
    d = f"{tpl}/word_language_model/data/rs"
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(2)
    words = [f"w{i}" for i in range(120)]
    for name, n in (("train", 3300), ("valid", 700), ("test", 700)):
        with open(f"{d}/{name}.txt", "w") as fh:
            left = n
            while left > 0:
                k = int(min(left, rng.integers(5, 20)))
                fh.write(" " + " ".join(words[j] for j in rng.integers(0, len(words), k)) + " \n")
                left -= k
    return "word_language_model"


NANOGPT_CMD = ("train.py --device=cpu --compile=False --dtype=float32 --gradient_accumulation_steps=1"
               " --n_layer=2 --n_head=2 --n_embd=64 --block_size=64 --batch_size=4 --max_iters=200"
               " --eval_interval=50 --eval_iters=5 --log_interval=10 --warmup_iters=50 --lr_decay_iters=200"
               " --dataset=rs --out_dir=out")
MNIST_CMD = "main.py --epochs 4 --batch-size 64 --test-batch-size 500 --log-interval 5 --no-accel --save-model"

SCRIPTS = {
    "nanogpt": dict(
        build=nanogpt, cmd=NANOGPT_CMD, every=20,
        counter=r"^iter (\d+):", counter_desc="iter N", outputs=["out"],
        # iterations 0..max_iters, one step each; --lr_decay_iters=200 keeps the schedule independent of the bound
        extend=dict(bound="--max_iters 200→250", steps=50,
                    cmd2=_raised(NANOGPT_CMD, "--max_iters=200", "--max_iters=250")),
    ),
    # nanoGPT's own default: the model wrapped by torch.compile (inductor, C++ on the CPU)
    "nanogpt-compile": dict(
        build=nanogpt, cmd=NANOGPT_CMD.replace("--compile=False", "--compile=True"), every=20,
        counter=r"^iter (\d+):", counter_desc="iter N", outputs=["out"],
    ),
    "mnist": dict(
        build=mnist,
        cmd=MNIST_CMD,
        every=20, counter=r"^Train Epoch: (\d+) \[(\d+)/", counter_desc="epoch, sample", outputs=["mnist_cnn.pt"],
        extend=dict(bound="--epochs 4→5", steps=25,  # 1600 images, batch 64; StepLR steps per epoch
                    cmd2=_raised(MNIST_CMD, "--epochs 4", "--epochs 5")),
    ),
    "dcgan": dict(
        build=dcgan,
        cmd=("main.py --dataset fake --niter 3 --batchSize 32 --workers 0 --ngf 8 --ndf 8 --nz 16"
             " --manualSeed 1 --outf out"),
        every=20, counter=r"^\[(\d+)/\d+\]\[(\d+)/\d+\]", counter_desc="epoch, i", outputs=["out"],
    ),
    "wlm": dict(
        build=wlm,
        cmd=("main.py --data data/rs --emsize 32 --nhid 32 --nlayers 2 --bptt 10 --batch_size 8 --epochs 4"
             " --log-interval 10 --save model.pt"),
        every=20, counter=r"^\| epoch +(\d+) \| +(\d+)/", counter_desc="epoch, batch", outputs=["model.pt"],
    ),
    "wlm-opt": dict(
        build=wlm,
        cmd=("main.py --data data/rs --emsize 32 --nhid 32 --nlayers 2 --bptt 10 --batch_size 8 --epochs 4"
             " --log-interval 10 --save model.pt --use-optimizer --lr 0.005"),
        every=20, counter=r"^\| epoch +(\d+) \| +(\d+)/", counter_desc="epoch, batch", outputs=["model.pt"],
    ),
}


def vae(tpl):
    mnist(tpl)  # the same ../data/MNIST/raw files
    shutil.rmtree(f"{tpl}/mnist")
    _copy(f"{SRC}/examples/vae", f"{tpl}/vae")
    os.makedirs(f"{tpl}/vae/results", exist_ok=True)  # main.py writes results/*.png into it
    return "vae"


SCRIPTS["vae"] = dict(
    build=vae, cmd="main.py --epochs 4 --batch-size 64 --log-interval 5 --no-accel",
    every=20, counter=r"^Train Epoch: (\d+) \[(\d+)/", counter_desc="epoch, sample", outputs=["results"],
)


# ── training loops in a class of their own module, and torchrun ─────────────

def _patch(path, edits):
    """Exact text replacements in a copied file; each old text must occur (else the source moved on)."""
    with open(path) as fh:
        text = fh.read()
    for old, new in edits:
        if old not in text:
            raise RuntimeError(f"{path}: patch target not found (another commit of the source?): {old!r}")
        text = text.replace(old, new)
    with open(path, "w") as fh:
        fh.write(text)


def _text(path, n, seed):
    """n random characters, one line (a character-level corpus; chargpt's prompt "O God, O God!"
    needs its letters)."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as fh:
        fh.write("".join(rng.choice(list("abcdefghijklmnopqrstuvwxyzGO ,.;!"), n)))


def chargpt(tpl):
    _copy(f"{SRC}/minGPT", f"{tpl}/minGPT")
    _text(f"{tpl}/minGPT/projects/chargpt/input.txt", 20000, 3)  # chargpt.py opens input.txt
    return "minGPT/projects/chargpt"


# The CPU/gloo edits the torchrun scripts need (they pick cuda:<LOCAL_RANK> unconditionally). Each
# keeps the GPU path as it was; the scripts' own flags choose the CPU (nanoGPT: --device=cpu).
PATCHES = {
    "minGPT-ddp/mingpt/main.py": [
        # verify_min_gpu_count() exits without 2 GPUs
        ("if not verify_min_gpu_count(min_gpus=_min_gpu_count):",
         "if torch.accelerator.is_available() and not verify_min_gpu_count(min_gpus=_min_gpu_count):"),
        # ddp_setup(): without an accelerator (a CUDA build still names one), the CPU, whose backend is gloo
        ('device: torch.device = torch.device(f"{acc}:{rank}")',
         'device: torch.device = torch.device(f"{acc}:{rank}" if torch.accelerator.is_available() else "cpu")'),
        ("    torch.accelerator.set_device_index(rank)",
         "    if torch.accelerator.is_available(): torch.accelerator.set_device_index(rank)"),
    ],
    "minGPT-ddp/mingpt/trainer.py": [
        ('self.device: torch.device = torch.device(f"{self.acc}:{self.local_rank}")',
         'self.device: torch.device = torch.device(f"{self.acc}:{self.local_rank}"'
         ' if torch.accelerator.is_available() else "cpu")'),
        ("model.to(self.local_rank)", "model.to(self.device)"),
        ("source.to(self.local_rank)", "source.to(self.device)"),
        ("targets.to(self.local_rank)", "targets.to(self.device)"),
        ("DDP(self.model, device_ids=[self.local_rank])",
         "DDP(self.model, device_ids=[self.local_rank] if self.device.type != 'cpu' else None)"),
    ],
    "ddp-tutorial-series/multigpu.py": [
        # one CUDA device per rank, nccl: the CPU, whose backend is gloo, and two ranks
        ('    torch.cuda.set_device(rank)\n    init_process_group(backend="nccl", rank=rank, world_size=world_size)',
         '    init_process_group(backend="gloo", rank=rank, world_size=world_size)'),
        ("self.model = model.to(gpu_id)", "self.model = model"),
        ("source = source.to(self.gpu_id)", "source = source"),
        ("targets = targets.to(self.gpu_id)", "targets = targets"),
        ("DDP(model, device_ids=[gpu_id])", "DDP(model)"),
        ("world_size = torch.cuda.device_count()", "world_size = 2"),
    ],
    "nanoGPT/train.py": [
        # `device = f'cuda:{ddp_local_rank}'` and torch.cuda.set_device() under torchrun, whatever --device says
        ("    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)",
         "    if device != 'cpu':\n        device = f'cuda:{ddp_local_rank}'\n        torch.cuda.set_device(device)"),
        ("DDP(model, device_ids=[ddp_local_rank])",
         "DDP(model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None)"),
    ],
}


def _apply_patches(tpl, prefix):
    for rel, edits in PATCHES.items():
        if rel.startswith(prefix + "/"):
            _patch(f"{tpl}/{rel}", edits)


def mingpt_ddp(tpl):
    _copy(f"{SRC}/examples/distributed/minGPT-ddp", f"{tpl}/minGPT-ddp")
    _apply_patches(tpl, "minGPT-ddp")
    # 388 characters, block 32: 356 samples, 320 train (random_split 0.9): 20 iterations of 8 per rank
    _text(f"{tpl}/minGPT-ddp/mingpt/rs_input.txt", 388, 4)
    return "minGPT-ddp/mingpt"


def ddp_spawn(tpl):
    _copy(f"{SRC}/examples/distributed/ddp-tutorial-series", f"{tpl}/ddp-tutorial-series")
    _apply_patches(tpl, "ddp-tutorial-series")
    return "ddp-tutorial-series"


def nanogpt_ddp(tpl):
    sub = nanogpt(tpl)
    _apply_patches(tpl, "nanoGPT")
    return sub


PT_CONFIG = {  # config.json of the template, at a tiny size (n_gpu 0, no workers, no tensorboard)
    "name": "Mnist_LeNet", "n_gpu": 0,
    "arch": {"type": "MnistModel", "args": {}},
    "data_loader": {"type": "MnistDataLoader", "args": {
        "data_dir": "data/", "batch_size": 64, "shuffle": True, "validation_split": 0.1, "num_workers": 0}},
    "optimizer": {"type": "Adam", "args": {"lr": 0.001, "weight_decay": 0, "amsgrad": True}},
    "loss": "nll_loss", "metrics": ["accuracy", "top_k_acc"],
    "lr_scheduler": {"type": "StepLR", "args": {"step_size": 2, "gamma": 0.5}},
    "trainer": {"epochs": 4, "save_dir": "saved/", "save_period": 1, "verbosity": 2,
                "monitor": "min val_loss", "early_stop": 10, "tensorboard": False},
}


def pytorch_template(tpl):
    import json
    _copy(f"{SRC}/pytorch-template", f"{tpl}/pytorch-template")
    _mnist_raw(f"{tpl}/pytorch-template/data")  # MnistDataLoader: datasets.MNIST('data/', download=True) finds them
    with open(f"{tpl}/pytorch-template/rs_config.json", "w") as fh:
        json.dump(PT_CONFIG, fh, indent=4)
    return "pytorch-template"


def _pt_epochs(n):
    """An edit of the run directory: rs_config.json's trainer epochs set to n (the template's bound)."""
    def edit(workdir):
        import json
        path = f"{workdir}/rs_config.json"
        with open(path) as fh:
            cfg = json.load(fh)
        cfg["trainer"]["epochs"] = n
        with open(path, "w") as fh:
            json.dump(cfg, fh, indent=4)
    return edit


TORCHRUN = "-m torch.distributed.run --standalone --nproc-per-node 2"

CHARGPT_CMD = ("chargpt.py --model.model_type=None --model.n_layer=2 --model.n_head=2 --model.n_embd=32"
               " --data.block_size=32 --trainer.batch_size=8 --trainer.max_iters=520 --trainer.num_workers=0")
SCRIPTS["chargpt"] = dict(
    build=chargpt, cmd=CHARGPT_CMD,
    every=20, pythonpath=["../.."],  # `from mingpt.model import GPT`: the repo root, as `pip install -e .` would
    counter=r"^iter_dt [\d.]+ms; iter (\d+):", counter_desc="iter", outputs=["out"],
    # Trainer.run() stops once iter_num >= max_iters; a constant learning rate
    extend=dict(bound="--trainer.max_iters 520→570", steps=50,
                cmd2=_raised(CHARGPT_CMD, "--trainer.max_iters=520", "--trainer.max_iters=570")),
)
SCRIPTS["mingpt-ddp"] = dict(
    build=mingpt_ddp,
    cmd=(f"{TORCHRUN} main.py gpt_config.n_layer=2 gpt_config.n_head=2 gpt_config.n_embd=32"
         " data_config.path=rs_input.txt data_config.block_size=32 data_config.truncate=1.0"
         " trainer_config.max_epochs=4 trainer_config.batch_size=8 trainer_config.data_loader_workers=0"
         " trainer_config.use_amp=False trainer_config.save_every=2"),
    every=10, nproc=2, seed=0,  # main.py seeds nothing (random_split, GPT init)
    counter=r"^\[RANK(\d+)\] Epoch (\d+) \| Iter (\d+) \| Train", counter_desc="rank, epoch, iter",
    outputs=["gpt_snapshot.pt"],
)
SCRIPTS["nanogpt-ddp"] = dict(
    build=nanogpt_ddp,
    cmd=f"{TORCHRUN} " + NANOGPT_CMD.replace("--gradient_accumulation_steps=1", "--gradient_accumulation_steps=2")
    + " --backend=gloo",
    every=20, nproc=2, counter=r"^iter (\d+):", counter_desc="iter N", outputs=["out"],
)
SCRIPTS["nanogpt-ddp"]["extend"] = dict(
    bound="--max_iters 200→250", steps=50,
    cmd2=_raised(SCRIPTS["nanogpt-ddp"]["cmd"], "--max_iters=200", "--max_iters=250"))
SCRIPTS["ddp-spawn"] = dict(  # PyTorch's DDP tutorial: torch.multiprocessing.spawn starts the ranks, not torchrun
    build=ddp_spawn, cmd="multigpu.py 4 1 --batch_size 64",
    every=10, nproc=2, spawned=True, seed=0,  # MyTrainDataset draws torch.rand, seeded nowhere
    counter=r"^\[GPU(\d+)\] Epoch (\d+) \|", counter_desc="rank, epoch", outputs=["checkpoint.pt"],
)
SCRIPTS["pytorch-template"] = dict(
    build=pytorch_template, cmd="train.py -c rs_config.json",
    every=20, counter=r"^Train Epoch: (\d+) \[(\d+)/", counter_desc="epoch, sample",
    outputs=["saved/models"], rename=(r"\b\d{4}_\d{6}\b", "<run_id>"),  # ConfigParser's run id: the clock
    # 1440 training images (validation_split 0.1), batch 64: 23 steps an epoch; StepLR(2) per epoch
    extend=dict(bound="rs_config.json trainer.epochs 4→5", steps=23, edit=_pt_epochs(5)),
)


# ── frameworks: HF Accelerate (datasets before torch), timm's train.py, Lightning ─────────

def _word_lines(path, n_lines, seed):
    """n_lines lines of 6-18 words drawn from 60 made-up words (a text corpus for a tiny tokenizer)."""
    rng = np.random.default_rng(seed)
    words = [f"w{chr(97 + i % 26)}{chr(97 + (i * 7) % 26)}{i}" for i in range(60)]
    with open(path, "w") as fh:
        for _ in range(n_lines):
            fh.write(" ".join(words[j] for j in rng.integers(0, len(words), int(rng.integers(6, 19)))) + "\n")


def hf_clm(tpl):
    """transformers' examples/pytorch/language-modeling/run_clm_no_trainer.py (Accelerate loop; imports
    `datasets` before torch), with a tiny byte-level BPE tokenizer trained here, a 2-layer GPT-2 config
    and local text files: nothing from the Hub."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, PreTrainedTokenizerFast

    d = f"{tpl}/clm"
    os.makedirs(d)
    shutil.copy(f"{SRC}/transformers/examples/pytorch/language-modeling/run_clm_no_trainer.py", d)
    _word_lines(f"{d}/train.txt", 400, 5)
    _word_lines(f"{d}/valid.txt", 40, 6)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([f"{d}/train.txt"], trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>", model_max_length=64)
    fast.save_pretrained(f"{d}/tok")
    eos = tok.token_to_id("<|endoftext|>")
    GPT2Config(vocab_size=tok.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=2,
               bos_token_id=eos, eos_token_id=eos).save_pretrained(f"{d}/cfg")
    return "clm"


HF_CLM_CMD = ("run_clm_no_trainer.py --config_name cfg --tokenizer_name tok --train_file train.txt"
              " --validation_file valid.txt --block_size 32 --per_device_train_batch_size 4"
              " --per_device_eval_batch_size 8 --num_train_epochs 2 --learning_rate 1e-3 --seed 0 --output_dir out")
# the default linear schedule's length is --num_train_epochs, so a straight 3-epoch run differs from the first
# step on: the extension runs the same command with a constant schedule, which does not depend on the bound
HF_CLM_CONSTANT_CMD = HF_CLM_CMD + " --lr_scheduler_type constant"
SCRIPTS["hf-clm"] = dict(
    build=hf_clm, cmd=HF_CLM_CMD, every=20,
    counter=r"^.*epoch (\d+): perplexity", counter_desc="epoch (eval)", outputs=["out"],
    extend=dict(bound="--num_train_epochs 2→3 (--lr_scheduler_type constant)", steps=105,  # 105 steps an epoch
                cmd=HF_CLM_CONSTANT_CMD,
                cmd2=_raised(HF_CLM_CONSTANT_CMD, "--num_train_epochs 2", "--num_train_epochs 3")),
)
SCRIPTS["hf-clm-ddp"] = dict(  # the same under torchrun, 2 ranks. Accelerate takes MULTI_CPU (gloo) only with
    # ACCELERATE_USE_CPU=true (what `accelerate launch --cpu` sets; without it each rank trains alone, NO)
    build=hf_clm, cmd=f"{TORCHRUN} {HF_CLM_CMD}", every=20, nproc=2, env={"ACCELERATE_USE_CPU": "true"},
    counter=r"^.*epoch (\d+): perplexity", counter_desc="epoch (eval)", outputs=["out"],
)


def timm_train(tpl):
    """pytorch-image-models' train.py run from its source tree (its own timm/ package), on a generated
    ImageFolder: 4 classes x 24 train / 8 validation 32x32 PNGs."""
    from PIL import Image

    _copy(f"{SRC}/pytorch-image-models", f"{tpl}/pytorch-image-models")
    rng = np.random.default_rng(7)
    for split, n in (("train", 24), ("validation", 8)):
        for c in range(4):
            d = f"{tpl}/pytorch-image-models/data/{split}/c{c}"
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                img = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                img[:, :, c % 3] = np.clip(img[:, :, c % 3].astype(int) + 60 * c, 0, 255)
                Image.fromarray(img).save(f"{d}/{i}.png")
    return "pytorch-image-models"


TIMM_CMD = ("train.py --data-dir data --model resnet10t --num-classes 4 --img-size 32 --batch-size 8 -vb 16"
            " --epochs 6 --sched cosine --warmup-epochs 0 --lr 0.05 --workers 2 --model-ema --model-ema-decay 0.9"
            " --device cpu --seed 0 --log-interval 4 --checkpoint-hist 2 --output out --experiment rs")
# the cosine schedule's length is --epochs, so a straight --epochs 8 run differs from the first update on:
# the extension runs the same command with a step schedule, which does not depend on the bound
TIMM_STEP_CMD = _raised(TIMM_CMD, "--sched cosine", "--sched step --decay-epochs 2 --decay-rate 0.5")
SCRIPTS["timm"] = dict(
    build=timm_train, cmd=TIMM_CMD,
    every=20, counter=r"^Train: (\d+) \[ *(\d+)/", counter_desc="epoch, update", outputs=["out"],
    extend=dict(bound="--epochs 6→8 (--sched step)", steps=24,  # 96 images, batch 8: 12 updates an epoch
                cmd=TIMM_STEP_CMD, cmd2=_raised(TIMM_STEP_CMD, "--epochs 6", "--epochs 8")),
)


def _mnist_full(raw, n_train, n_test, seed):
    os.makedirs(raw, exist_ok=True)
    rng = np.random.default_rng(seed)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        _idx(f"{raw}/{prefix}-images-idx3-ubyte", 2051, rng.integers(0, 256, (n, 28, 28)))
        _idx(f"{raw}/{prefix}-labels-idx1-ubyte", 2049, rng.integers(0, 10, (n,)))


def lightning_cls(tpl):
    """Lightning's examples/pytorch/basics/backbone_image_classifier.py (LightningCLI, Trainer with its
    default ModelCheckpoint; test and predict on ckpt_path="best" after fit) on random MNIST files: the
    script splits 60000 training images 55000/5000, so the full count is written."""
    base = f"{tpl}/lightning/examples"
    os.makedirs(f"{base}/pytorch/basics")
    basics = f"{SRC}/pytorch-lightning/examples/pytorch/basics"
    shutil.copy(f"{basics}/backbone_image_classifier.py", f"{base}/pytorch/basics")
    _mnist_full(f"{base}/Datasets/MNIST/raw", 60000, 10000, 8)  # DATASETS_PATH: examples/Datasets
    os.symlink("../../Datasets", f"{base}/pytorch/basics/data")  # demos' MNIST() first checks ./data
    return "lightning/examples/pytorch/basics"


SCRIPTS["lightning-cli"] = dict(
    build=lightning_cls,
    cmd=("backbone_image_classifier.py --trainer.max_epochs=3 --trainer.limit_train_batches=50"
         " --trainer.limit_val_batches=4 --trainer.limit_test_batches=4 --trainer.limit_predict_batches=2"
         " --trainer.accelerator=cpu --trainer.devices=1 --trainer.log_every_n_steps=10 --data.batch_size=32"),
    every=20, counter=r"^Epoch (\d+):.*\| (\d+)/\d+ \[", counter_desc="epoch, batch",
    outputs=["lightning_logs"],
)


def lightning_lm(tpl):
    """Lightning's examples/pytorch/basics/transformer.py (plain Trainer, max_epochs=20, shuffled loader;
    lightning.pytorch.demos' Transformer and WikiText2, which reads ./data/wikitext-2.txt when it is
    there): 4100 blocks of 35 random words, so the script's split (n - 4000, 2000, 2000) trains on 100
    samples, 5 batches of 20 per epoch."""
    base = f"{tpl}/lightning/examples/pytorch/basics"
    os.makedirs(f"{base}/data")
    shutil.copy(f"{SRC}/pytorch-lightning/examples/pytorch/basics/transformer.py", base)
    rng = np.random.default_rng(9)
    words = [f"t{i}" for i in range(100)]
    left = 4102 * 35
    with open(f"{base}/data/wikitext-2.txt", "w") as fh:
        while left > 0:
            k = int(rng.integers(9, 20))
            fh.write(" " + " ".join(words[j] for j in rng.integers(0, len(words), k)) + " \n")
            left -= k + 1  # + <eos>
    return "lightning/examples/pytorch/basics"


SCRIPTS["lightning-lm"] = dict(
    build=lightning_lm, cmd="transformer.py", every=20,
    counter=r"^Epoch (\d+):.*\| (\d+)/\d+ \[", counter_desc="epoch, batch", outputs=["lightning_logs"],
)

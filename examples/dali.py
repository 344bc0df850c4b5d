"""NVIDIA DALI feeding a training loop: JPEGs read, decoded, resized, cropped and normalised by DALI.

Unlike the other examples this one trains on images (DALI is an image and video pipeline): the
course's MNIST digits, written once as JPEG files, train a small MLP. The lines marked `# + dali`
are the pipeline and its iterator, which take the place of a Dataset and a DataLoader; on a GPU
the decoding runs there ("mixed"). Where DALI is not installed it says so and stops.

    pip install nvidia-dali-cuda120   # (see DALI's install guide for other CUDA versions)
    python examples/dali.py
"""

import atexit
import shutil
import sys
import tempfile
import time
from pathlib import Path

import parts
import torch
from torch import nn

args = parts.arguments("Train a small MLP on MNIST JPEGs fed by NVIDIA DALI.",
                       **{"--images": dict(type=int, default=2048, choices=range(64, 5001), metavar="N",
                                           help="digits written as JPEGs (64 to 5000)")})
try:
    from nvidia.dali import fn, pipeline_def, types  # + dali
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy  # + dali
except ImportError:
    print("NVIDIA DALI is not installed here, so there is nothing to train (pip install nvidia-dali-cuda120)")
    sys.exit(0)
from PIL import Image

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
device = parts.device()
on_gpu = device.type == "cuda"

# The digits as JPEG files under <label>/, and the "path label" list DALI's file reader takes.
images, labels = parts.digits(args.images, seed=args.seed)
root = Path(tempfile.mkdtemp(prefix="dali-digits-"))
atexit.register(shutil.rmtree, root, ignore_errors=True)  # the files go when the script ends
lines = []
for i, (pixels, label) in enumerate(zip(images.numpy(), labels.tolist())):
    (root / str(label)).mkdir(exist_ok=True)
    Image.fromarray(pixels).save(root / f"{label}/{i:05d}.jpg", quality=95)
    lines.append(f"{label}/{i:05d}.jpg {label}\n")
(root / "files.txt").write_text("".join(lines))


@pipeline_def(batch_size=args.batch_size, num_threads=2, device_id=0 if on_gpu else None)  # + dali: None: CPU only
def digits():  # + dali: the whole input pipeline, run by DALI's threads (and the GPU)
    jpegs, labels = fn.readers.file(file_root=str(root), file_list=str(root / "files.txt"),
                                    random_shuffle=True, name="Reader")
    images = fn.decoders.image(jpegs, device="mixed" if on_gpu else "cpu", output_type=types.GRAY)
    images = fn.resize(images, resize_x=32, resize_y=32)
    images = fn.crop_mirror_normalize(images, crop=(28, 28), crop_pos_x=fn.random.uniform(range=(0.0, 1.0)),
                                      crop_pos_y=fn.random.uniform(range=(0.0, 1.0)), mean=[MNIST_MEAN * 255],
                                      std=[MNIST_STD * 255], dtype=types.FLOAT, output_layout="CHW")
    return images, labels.gpu() if on_gpu else labels


pipe = digits(seed=args.seed)  # + dali
pipe.build()  # + dali
loader = DALIGenericIterator([pipe], ["inputs", "labels"], reader_name="Reader",  # + dali
                             last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)
batches = parts.forever(loader)
torch.manual_seed(args.seed)
model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                      nn.Linear(256, 10)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
print(parts.trainable(model))

losses = []
start = time.perf_counter()
for step in range(1, args.steps + 1):
    batch = next(batches)[0]  # + dali: one dict per pipeline, already on the device
    inputs, labels = batch["inputs"].to(device), batch["labels"].squeeze(-1).long().to(device)
    loss = nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.item())
    print(f"step {step:>3}  loss {losses[-1]:.4f}")
elapsed = time.perf_counter() - start
print(f"{args.steps} steps in {elapsed:.2f} s ({elapsed / args.steps * 1e3:.1f} ms a step); {parts.peak_memory(device)}")
print("losses:", losses)

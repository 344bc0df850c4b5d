"""Tests for workbench.core.data.datasets: real offline data sets, fixed splits, seeded loaders.

Nothing here touches the network: hub names are tested with a mocked
`datasets.load_dataset` that returns small local data sets.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.core.data import (
    DATASETS,
    build_dataloader,
    catalog,
    load,
    load_data,
    sources,
    tables,
)
from workbench.machine import data_cache

TASKS = {"image_classification", "text_classification", "language_modeling"}


@pytest.fixture(scope="module")
def mnist() -> catalog.DataBundle:
    return load_data("mnist")


@pytest.fixture(scope="module")
def rotten() -> catalog.DataBundle:
    return load_data("rotten_tomatoes")


def test_registry_declares_a_valid_task_and_compatible_models_for_every_data_set() -> None:
    for name, info in DATASETS.items():
        assert info.name == name and info.task in TASKS
        assert info.train_size > 0 and info.test_size > 0
    assert DATASETS["mnist"].models == ("mlp", "cnn") == DATASETS["digits"].models
    assert DATASETS["rotten_tomatoes"].models == ("minilm",)
    assert DATASETS["rotten_tomatoes_lm"].models == ("gpt",)


def test_mnist_split_is_4000_train_1000_test(mnist: catalog.DataBundle) -> None:
    assert (len(mnist.train), len(mnist.test)) == (4000, 1000)
    assert (DATASETS["mnist"].train_size, DATASETS["mnist"].test_size) == (4000, 1000)
    assert mnist.task == "image_classification" and mnist.num_classes == 10
    assert mnist.input_shape == (1, 28, 28) and mnist.tokens_per_sample is None


def test_mnist_items_are_normalised_float_images_with_int64_labels(mnist: catalog.DataBundle) -> None:
    item = mnist.train[0]
    assert set(item) == {"inputs", "labels"}
    assert item["inputs"].shape == (1, 28, 28) and item["inputs"].dtype == torch.float32
    assert item["labels"].dtype == torch.int64
    x = mnist.train.inputs
    assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05


def test_mnist_split_is_stratified_because_the_file_is_sorted_by_label(mnist: catalog.DataBundle) -> None:
    assert mnist.train.labels.bincount().tolist() == [400] * 10
    assert mnist.test.labels.bincount().tolist() == [100] * 10


def test_digits_split_is_1437_train_360_test_of_8x8_images() -> None:
    digits = load_data("digits")
    assert (len(digits.train), len(digits.test)) == (1437, 360)
    assert (DATASETS["digits"].train_size, DATASETS["digits"].test_size) == (1437, 360)
    assert digits.train.inputs.shape == (1437, 1, 8, 8) and digits.train.inputs.dtype == torch.float32
    assert abs(digits.train.inputs.mean().item()) < 0.05
    assert set(digits.test.labels.tolist()) == set(range(10))


def test_rotten_tomatoes_sizes_shapes_and_padding_match_the_registry(rotten: catalog.DataBundle) -> None:
    info = DATASETS["rotten_tomatoes"]
    assert (len(rotten.train), len(rotten.test)) == (info.train_size, info.test_size)
    assert rotten.train.inputs.shape == (info.train_size, 128)
    assert rotten.train.inputs.dtype == torch.int64 and rotten.train.labels.dtype == torch.int64
    assert rotten.num_classes == 2 and rotten.vocab_size == 30522 and rotten.pad_token_id == 0
    assert rotten.tokens_per_sample == 128 and rotten.input_shape == (128,)
    assert (rotten.train.inputs[:, 0] == 101).all()  # every example starts with [CLS]
    assert (rotten.train.inputs[:, -1] == rotten.pad_token_id).float().mean() > 0.9  # short snippets


def test_rotten_tomatoes_labels_are_binary_and_roughly_balanced(rotten: catalog.DataBundle) -> None:
    for split in (rotten.train, rotten.test):
        assert set(split.labels.unique().tolist()) == {0, 1}
        assert 0.5 < split.labels.float().mean().item() < 0.65  # 58% fresh in the file


def test_rotten_tomatoes_seq_len_truncates_and_pads() -> None:
    short = load_data("rotten_tomatoes", seq_len=16, max_train=64, max_test=8)
    assert short.train.inputs.shape == (64, 16) and short.input_shape == (16,)


def test_lm_labels_are_inputs_shifted_by_one() -> None:
    lm = load_data("rotten_tomatoes_lm")
    assert lm.task == "language_modeling" and lm.vocab_size == 256 and lm.num_classes is None
    assert lm.train.inputs.shape == lm.train.labels.shape == (DATASETS["rotten_tomatoes_lm"].train_size, 128)
    assert torch.equal(lm.train.inputs[:, 1:], lm.train.labels[:, :-1])
    assert torch.equal(lm.test.inputs[:, 1:], lm.test.labels[:, :-1])
    assert 0 <= int(lm.train.inputs.min()) and int(lm.train.inputs.max()) < 256
    corpus = "\n".join(sources.rotten_tomatoes_reviews()["text"]).encode("utf-8")  # the reviews, one per line
    assert bytes(lm.train.inputs[0].tolist()) == corpus[:128]
    assert bytes(lm.train.inputs[1].tolist()) == corpus[129:257]  # windows of 129 do not overlap


def test_lm_sizes_depend_on_seq_len_and_train_size_predicts_them() -> None:
    lm = load_data("rotten_tomatoes_lm", seq_len=256)
    assert (len(lm.train), len(lm.test)) == catalog.split_sizes("rotten_tomatoes_lm", 256)
    assert catalog.train_size("rotten_tomatoes_lm", 256) == len(lm.train)
    assert 0.04 < len(lm.test) / (len(lm.train) + len(lm.test)) < 0.06
    assert catalog.train_size("rotten_tomatoes_lm", 64) > catalog.train_size("rotten_tomatoes_lm", 256)
    assert catalog.train_size("mnist", 64) == 4000 and catalog.split_sizes("mnist") == (4000, 1000)
    assert catalog.train_size("hub:someone/something") is None and catalog.split_sizes("hub:x/y") is None


def test_unknown_name_error_names_the_field_and_lists_valid_names() -> None:
    with pytest.raises(ValueError) as err:
        load_data("mnits")
    message = str(err.value)
    assert "\n" not in message and message.startswith("data='mnits' is not a known data set")
    for name in DATASETS:
        assert name in message
    assert "'hub:<name>'" in message
    with pytest.raises(ValueError, match="data='mnits'"):
        catalog.train_size("mnits")


def test_max_train_keeps_the_first_n_after_a_seeded_shuffle(mnist: catalog.DataBundle) -> None:
    a = load_data("mnist", max_train=100, seed=1)
    b = load_data("mnist", max_train=100, seed=2)
    assert len(a.train) == 100 and len(a.test) == 1000
    assert not torch.equal(a.train.inputs, b.train.inputs)
    # Every kept example is one of the full training set's, and none repeats.
    full = mnist.train.inputs.flatten(1)
    rows = [int(torch.nonzero((full == x).all(1))[0]) for x in a.train.inputs.flatten(1)[:20]]
    assert len(set(rows)) == 20
    assert load_data("mnist", max_train=10**6).train.inputs.shape[0] == 4000


def test_max_test_subset_is_the_same_for_every_run_seed() -> None:
    a = load_data("mnist", max_train=10, max_test=30, seed=1)
    b = load_data("mnist", max_train=10, max_test=30, seed=2)
    assert torch.equal(a.test.inputs, b.test.inputs) and not torch.equal(a.train.labels, b.train.labels)


def test_max_train_subsample_is_the_same_after_the_cache_is_cleared() -> None:
    first = load_data("mnist", max_train=50, max_test=30, seed=3)
    load._load_cached.cache_clear()
    tables._whole.cache_clear()
    tables._prepared.cache_clear()
    again = load_data("mnist", max_train=50, max_test=30, seed=3)
    assert first is not again
    assert torch.equal(first.train.inputs, again.train.inputs) and torch.equal(first.test.labels, again.test.labels)


def test_load_data_returns_the_cached_bundle_for_the_same_arguments() -> None:
    assert load_data("digits") is load_data("digits")
    assert load_data("digits", seq_len=64) is load_data("digits")  # images ignore seq_len


def test_load_data_rejects_a_non_positive_max_train() -> None:
    with pytest.raises(ValueError, match="max_train=0"):
        load_data("mnist", max_train=0)


def _order(loader: torch.utils.data.DataLoader) -> list[int]:
    return [int(x) for batch in loader for x in batch["labels"]]


def test_dataloader_order_is_reproducible_with_the_same_seed() -> None:
    ds = catalog.TensorDictDataset(torch.zeros(64, 3), torch.arange(64))
    first = _order(build_dataloader(ds, batch_size=8, shuffle=True, seed=5))
    torch.manual_seed(123)  # the global RNG must not matter
    assert _order(build_dataloader(ds, batch_size=8, shuffle=True, seed=5)) == first
    assert _order(build_dataloader(ds, batch_size=8, shuffle=True, seed=6)) != first
    assert sorted(first) == list(range(64))
    assert _order(build_dataloader(ds, batch_size=8, shuffle=False, seed=5)) == list(range(64))


def test_dataloader_yields_dict_batches_and_drops_the_last_partial_batch(mnist: catalog.DataBundle) -> None:
    loader = build_dataloader(mnist.test, batch_size=300, shuffle=False, seed=0)
    batches = list(loader)
    assert len(batches) == 3
    assert batches[0]["inputs"].shape == (300, 1, 28, 28) and batches[0]["labels"].shape == (300,)
    assert len(build_dataloader(mnist.test, batch_size=300, shuffle=False, seed=0, drop_last=False)) == 4


def test_dataloader_ignores_worker_options_without_workers() -> None:
    ds = catalog.TensorDictDataset(torch.zeros(8, 2), torch.arange(8))
    loader = build_dataloader(ds, batch_size=4, shuffle=True, seed=0, prefetch_factor=4,
                              persistent_workers=True, pin_memory=True)
    assert len(list(loader)) == 2


def test_dataloader_with_a_worker_process_gives_the_same_order() -> None:
    ds = catalog.TensorDictDataset(torch.zeros(32, 2), torch.arange(32))
    single = _order(build_dataloader(ds, batch_size=4, shuffle=True, seed=9))
    worker = build_dataloader(ds, batch_size=4, shuffle=True, seed=9, num_workers=1, prefetch_factor=2)
    assert _order(worker) == single


# --- hub names: load_dataset is mocked, nothing is downloaded -------------------------

def _mock_hub(monkeypatch: pytest.MonkeyPatch, result: object) -> None:
    import datasets

    def fake_load_dataset(hub_id: str, *args: object, **kwargs: object) -> object:
        if isinstance(result, Exception):
            raise result
        return result

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)


def test_hub_name_raises_a_clear_one_line_error_when_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    _mock_hub(monkeypatch, ConnectionError("Couldn't reach the Hugging Face Hub\n(offline)"))
    with pytest.raises(ValueError) as err:
        load_data("hub:someone/offline-set")
    assert "\n" not in str(err.value)
    assert "data='hub:someone/offline-set' could not be loaded" in str(err.value)
    assert "ConnectionError" in str(err.value)


def test_hub_image_data_set_becomes_normalised_greyscale_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets
    from PIL import Image

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)) for _ in range(20)]
    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(num_classes=3)})
    split = lambda lo, hi: datasets.Dataset.from_dict(  # noqa: E731
        {"img": images[lo:hi], "label": [i % 3 for i in range(lo, hi)]}, features=features)
    _mock_hub(monkeypatch, datasets.DatasetDict(train=split(0, 15), test=split(15, 20)))
    bundle = load_data("hub:someone/tiny-rgb")
    assert bundle.task == "image_classification" and bundle.num_classes == 3
    assert bundle.input_shape == (1, 6, 5) and bundle.train.inputs.shape == (15, 1, 6, 5)
    assert (len(bundle.train), len(bundle.test)) == (15, 5)
    assert abs(bundle.train.inputs.mean().item()) < 1e-4


def test_hub_text_data_set_is_tokenised_like_rotten_tomatoes(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    texts = [f"review number {i} was {'great' if i % 2 else 'bad'}" for i in range(30)]
    _mock_hub(monkeypatch, datasets.Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(30)]}))
    bundle = load_data("hub:someone/tiny-text", seq_len=12)
    assert bundle.task == "text_classification" and bundle.num_classes == 2
    assert (len(bundle.train), len(bundle.test)) == (27, 3)  # no test split: a seeded 10% hold-out
    assert bundle.train.inputs.shape == (27, 12) and bundle.pad_token_id == 0


def test_hub_data_set_with_unknown_columns_raises_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    _mock_hub(monkeypatch, datasets.Dataset.from_dict({"question": ["a", "b"], "answer": ["c", "d"]}))
    with pytest.raises(ValueError) as err:
        load_data("hub:someone/qa")
    assert "\n" not in str(err.value) and "['answer', 'question']" in str(err.value)


# The disk cache (machine/data_cache.py): what a new process reads back is what preparing gives.

@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(data_cache.VARIABLE, str(tmp_path / "cache"))
    tables._whole.cache_clear()
    yield tmp_path / "cache"
    tables._whole.cache_clear()


def _through_datasets(name: str, seq_len: int, split: str, limit: int | None, seed: int) -> tuple:
    """The rows `datasets` itself picks: its shuffle(seed).select(range(limit)), read as torch."""
    train, test, _ = tables._prepared(name, seq_len)
    ds = train if split == "train" else test
    if limit is not None:
        ds = ds.shuffle(seed=seed).select(range(limit))
    t = ds.with_format("torch")[:]
    return t["inputs"], t["labels"].long()


@pytest.mark.parametrize("name, seq_len", [("mnist", 0), ("rotten_tomatoes_lm", 48)])
def test_a_set_read_back_from_the_disk_cache_is_the_one_preparing_gives(cache_folder, monkeypatch, name, seq_len):
    prepared = tables.load_table(name, seq_len, 100, 30, 7)
    assert [p.name.split("-")[0] for p in cache_folder.iterdir()] == [name]
    tables._whole.cache_clear()
    monkeypatch.setattr(tables, "_prepared", lambda *a: pytest.fail("prepared again, not read back"))
    read_back = tables.load_table(name, seq_len, 100, 30, 7)
    whole = tables.load_table(name, seq_len, None, None, 0)
    monkeypatch.undo()
    for bundle, (limit_train, limit_test, seed) in ((prepared, (100, 30, 7)), (read_back, (100, 30, 7)),
                                                    (whole, (None, None, 0))):
        for split, limit, split_seed in (("train", limit_train, seed), ("test", limit_test, sources.SPLIT_SEED)):
            inputs, labels = _through_datasets(name, seq_len, split, limit, split_seed)
            got = getattr(bundle, split)
            assert inputs.dtype == got.inputs.dtype and torch.equal(inputs, got.inputs) and torch.equal(labels, got.labels)
    assert (read_back.input_shape, read_back.vocab_size, read_back.num_classes) == (
        prepared.input_shape, prepared.vocab_size, prepared.num_classes)
    whole.train.inputs.zero_()  # a bundle's tensors are its own: another load is untouched
    assert not torch.equal(tables.load_table(name, seq_len, None, None, 0).train.inputs, whole.train.inputs)


def test_the_cache_file_is_named_by_the_source_the_code_and_the_packages(tmp_path, monkeypatch):
    source, code = tmp_path / "mnist_5k.csv.gz", tmp_path / "tables.py"
    source.write_bytes(b"one")
    code.write_text("x = 1")
    first = data_cache.key("mnist", 0, [source], [code])
    assert first.startswith("mnist-0-") and data_cache.key("mnist", 0, [source], [code]) == first
    assert data_cache.key("mnist", 32, [source], [code]) != first
    source.write_bytes(b"two")  # the file replaced (another size)
    second = data_cache.key("mnist", 0, [source], [code])
    code.write_text("x = 2")  # the preparing code changed
    third = data_cache.key("mnist", 0, [source], [code])
    monkeypatch.setattr(data_cache, "_version", lambda package: "9.9" if package == "datasets" else "1.0")
    assert len({first, second, third, data_cache.key("mnist", 0, [source], [code])}) == 4
    source.unlink()  # a missing source: no name, and the preparing code says what is missing
    assert data_cache.key("mnist", 0, [source], [code]) is None


def test_a_damaged_cache_file_is_prepared_again_and_written_whole(cache_folder):
    expected = tables.load_table("digits", 0, None, None, 0)
    file, = cache_folder.iterdir()
    file.write_bytes(file.read_bytes()[:1000])  # cut short, as a full disk would leave it
    tables._whole.cache_clear()
    again = tables.load_table("digits", 0, None, None, 0)
    assert torch.equal(again.train.inputs, expected.train.inputs)
    assert data_cache.read(file.name) is not None and not list(cache_folder.glob(".*partial"))


@pytest.mark.parametrize("setting", ["off", "a file, not a folder", "HOME empty"])
def test_a_cache_switched_off_or_unwritable_keeps_nothing_and_still_loads(tmp_path, monkeypatch, setting):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    if setting == "HOME empty":  # read as '/' by expanduser: no cache rather than one at the root
        monkeypatch.delenv(data_cache.VARIABLE, raising=False)
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
        monkeypatch.setenv("HOME", "")
        monkeypatch.chdir(tmp_path)
        assert data_cache.folder() is None
    else:
        monkeypatch.setenv(data_cache.VARIABLE, "off" if setting == "off" else str(blocker / "cache"))
    tables._whole.cache_clear()
    try:
        assert len(tables.load_table("digits", 0, 50, 20, 1).train) == 50
    finally:
        tables._whole.cache_clear()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]

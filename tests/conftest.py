"""Shared test set-up: the quick preset, headless sinks, offline hubs, one thread."""

import os

os.environ.setdefault("WORKBENCH_PRESET", "cpu-quick")
os.environ.setdefault("WORKBENCH_HEADLESS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

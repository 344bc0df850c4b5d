"""memory_format='channels_last' (core/switches/memory_format.py): the CNN's 4-D tensors laid out N,H,W,C.

The same math in another layout: the same losses, the same exact counts (saved activations, FLOPs),
the estimate's too; refused in one line where there is no convolution. Its speed is measured in
notebook 08, not here (a timing). Cost: two 3-step CNN runs in cpu-quick, about 2 s.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from workbench.cli import build_parser, config_from_args
from workbench.core.config import ConfigError, RunConfig, field_choices
from workbench.core.engine.train import run as train_run
from workbench.core.switches import memory_format
from workbench.planner.estimate import estimate
from workbench.planner.fit import check_fits

run = functools.partial(train_run, check_fit=check_fits)  # as wb.run does, without its default view


def _cnn(layout: str) -> RunConfig:
    return RunConfig(model="cnn", memory_format=layout, preset="cpu-quick", steps=3, eval_samples=0, seed=0)


def test_channels_last_trains_the_same_steps_in_the_other_layout():
    runs = {layout: run(_cnn(layout), sinks=[], keep_model=True) for layout in memory_format.CHOICES}
    plain, last = runs["contiguous"], runs["channels_last"]
    assert plain.status == last.status == "ok"
    convs = [m for m in last.model.modules() if isinstance(m, nn.Conv2d) and m.in_channels > 1]
    assert convs and all(m.weight.is_contiguous(memory_format=torch.channels_last)
                         and not m.weight.is_contiguous() for m in convs)  # (1 input channel: both at once)
    assert not any(m.weight.is_contiguous(memory_format=torch.channels_last) and not m.weight.is_contiguous()
                   for m in plain.model.modules() if isinstance(m, nn.Conv2d))
    # oneDNN sums each output pixel's products in another order: equal to fp32 rounding, not to the bit.
    torch.testing.assert_close(last.losses, plain.losses, rtol=1e-5, atol=1e-6)
    assert (last.memory.activation_bytes, last.flops_per_step) == (plain.memory.activation_bytes, plain.flops_per_step)
    predicted = estimate(_cnn("channels_last").resolved())
    assert (predicted.activation_bytes, predicted.flops_per_step) == (last.memory.activation_bytes, last.flops_per_step)


class NoConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_channels_last_is_refused_where_nothing_convolves():
    with pytest.raises(ConfigError) as refused:
        RunConfig(model="gpt", memory_format="channels_last").resolved()
    assert str(refused.value) == ("memory_format='channels_last' lays out 2-D convolutions' tensors and model='gpt' "
                                  "has none; use model='cnn' or memory_format='contiguous'")
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    with pytest.raises(ConfigError, match=r"^memory_format='channels_last' .* has no nn.Conv2d; pass memory_format='contiguous'$"):
        RunConfig(model=NoConv(), data=data, memory_format="channels_last").resolved()
    with pytest.raises(ConfigError, match="memory_format='nhwc' is not known; use one of: 'contiguous', 'channels_last'"):
        RunConfig(model="cnn", memory_format="nhwc").resolved()


def test_the_cli_and_the_choices_follow_the_switch():
    assert field_choices("memory_format") == memory_format.CHOICES
    cfg = config_from_args(build_parser().parse_args(["--model", "cnn", "--memory-format", "channels_last"]))
    assert cfg.memory_format == "channels_last"

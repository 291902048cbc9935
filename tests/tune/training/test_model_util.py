"""disable_dropout."""

import pytest
from torch import nn

from tune.training import disable_dropout


def test_disable_dropout_zeroes_every_dropout_and_warns():
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1), nn.Sequential(nn.Dropout(0.0)))
    with pytest.warns(UserWarning, match="p=0.1"):
        disable_dropout(model)
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.0, 0.0]

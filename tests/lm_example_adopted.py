"""lm_example's model module as a user adopts lstmgrad in the example's model.py: lstmgrad.nn is
imported where the model class is defined, so every script that unpickles the model (as the
example's generate.py does, importing only the model module) has imported it, which allows its
class under ``torch.load(weights_only=True)``; the model's torch.nn.LSTM is converted where the
model is built."""

from __future__ import annotations

from typing import Any

import lm_example
import lstmgrad.nn


class RNNModel(lm_example.RNNModel):
    """lm_example.RNNModel with its LSTM computed by lstmgrad."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        lstmgrad.nn.convert(self)

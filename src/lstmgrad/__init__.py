"""lstmgrad: the LSTM backward operator of Huawei CANN (aclnnLstmBackward) and its forward
(aclnnLSTM), with the exact contract, on an ordinary CPU.

Pythonic API: :func:`lstm_forward`, :func:`lstm_backward`. C-style two-phase mirror:
:mod:`lstmgrad.aclnn`. Device results checked against both engines: :func:`dump`, then
``lstmgrad check`` (:mod:`lstmgrad.check`).
"""

from .api import lstm_backward, lstm_forward
from .check import dump
from .contract import LstmBackwardResult, LstmForwardResult, LstmSaved
from .errors import (
    ACLNN_ERR_INNER,
    ACLNN_ERR_PARAM_INVALID,
    ACLNN_ERR_PARAM_NULLPTR,
    ACLNN_SUCCESS,
    LstmArgumentError,
    LstmError,
    LstmInternalError,
    LstmInvalidArgumentError,
    LstmMemoryError,
    LstmNullArgumentError,
)

__version__ = "0.1.0"

__all__ = [
    "lstm_forward",
    "lstm_backward",
    "dump",
    "LstmForwardResult",
    "LstmBackwardResult",
    "LstmSaved",
    "LstmError",
    "LstmArgumentError",
    "LstmNullArgumentError",
    "LstmInvalidArgumentError",
    "LstmInternalError",
    "LstmMemoryError",
    "ACLNN_SUCCESS",
    "ACLNN_ERR_PARAM_NULLPTR",
    "ACLNN_ERR_PARAM_INVALID",
    "ACLNN_ERR_INNER",
    "__version__",
]

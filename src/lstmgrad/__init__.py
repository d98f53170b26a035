"""lstmgrad: the LSTM backward operator of Huawei CANN (aclnnLstmBackward) and its forward
(aclnnLSTM), with the exact contract, on an ordinary CPU.

Pythonic API: :func:`lstm_forward`, :func:`lstm_backward`. C-style two-phase mirror:
:mod:`lstmgrad.aclnn`. Device results checked against both engines: :func:`dump`, then
``lstmgrad check`` (:mod:`lstmgrad.tools.check`).
"""

import importlib
import importlib.abc
import importlib.util
import sys

from .core.contract import LstmBackwardResult, LstmForwardResult, LstmSaved
from .core.errors import (
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
from .ops.api import lstm_backward, lstm_forward
from .tools.check import dump

# Modules as they were named before the packages (lstmgrad.nn, lstmgrad.aclnn, lstmgrad.plan,
# ...): each old name imports as the same module object under its package, so code, pickles
# and mocks that use the old paths keep working.
MOVED = {
    **dict.fromkeys(("contract", "dropout", "errors", "layout", "machine", "varlen", "workspace"), "core"),
    **dict.fromkeys(("aclnn", "api", "recompute", "tensors"), "ops"),
    **dict.fromkeys(("plan", "tune"), "planning"),
    **dict.fromkeys(("nn", "torch_grad", "torch_ops"), "pytorch"),
    **dict.fromkeys(("bench", "check", "cli", "demo", "golden", "metrics", "msprobe", "report", "workloads"), "tools"),
    "gemm": "fused",
}  # fmt: skip


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``lstmgrad.<old name>`` and loads it as the module of its package."""

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        head, _, leaf = name.partition(".")
        if head == __name__ and leaf in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        leaf = spec.name.partition(".")[2]
        return importlib.import_module(f"{__name__}.{MOVED[leaf]}.{leaf}")

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        pass  # the module ran under its own name


if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.append(_Moved())


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

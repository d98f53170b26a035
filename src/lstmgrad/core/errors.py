"""Error classes of the lstmgrad contract (docs/contract.md#error-codes).

Every error carries the contract's status code (``.code``) and the name of the argument it is
about (``.param``, the Python argument name as in the signature, ``None`` when no argument is
to blame). The C-style mirror (:mod:`lstmgrad.aclnn`) returns the same codes instead of raising.
"""

from __future__ import annotations

ACLNN_SUCCESS = 0
ACLNN_ERR_PARAM_NULLPTR = 161001
ACLNN_ERR_PARAM_INVALID = 161002
ACLNN_ERR_INNER = 561103


class LstmError(Exception):
    """Base of every lstmgrad error: ``.code`` (int status) and ``.param`` (argument name)."""

    code: int = ACLNN_ERR_INNER

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class LstmArgumentError(LstmError):
    """A caller-supplied argument breaks the contract; raised before any computation."""

    code = ACLNN_ERR_PARAM_INVALID


class LstmNullArgumentError(LstmArgumentError, TypeError):
    """A required tensor or list is missing (None), or a list holds None: code 161001."""

    code = ACLNN_ERR_PARAM_NULLPTR


class LstmInvalidArgumentError(LstmArgumentError, ValueError):
    """Wrong type, dtype, rank, shape, length or value: code 161002."""

    code = ACLNN_ERR_PARAM_INVALID


class LstmInternalError(LstmError, RuntimeError):
    """Something unexpected went wrong while computing: code 561103."""

    code = ACLNN_ERR_INNER


# Both ways in: an install from a package index, and an editable install in a clone.
TORCH_INSTALL = (
    'pip install "lstmgrad[torch]" (in a clone of the repository: pip install -e ".[torch]")'
)


def torch_missing(feature: str) -> ModuleNotFoundError:
    """The error for a PyTorch feature used without PyTorch (the optional ``[torch]`` extra).

    Args:
        feature: what needs PyTorch, e.g. ``"lstmgrad.nn"``.

    Returns:
        A ModuleNotFoundError (an ImportError) for module ``torch`` naming the install commands
        (from a package index, and in a clone of the repository).
    """
    return ModuleNotFoundError(
        f"{feature} needs PyTorch, which is not installed: {TORCH_INSTALL}", name="torch"
    )


class LstmMemoryError(LstmError, MemoryError):
    """A call needs more memory than the machine can give now (checked before it starts; the
    message names the need and what is available in bytes): code 561103."""

    code = ACLNN_ERR_INNER

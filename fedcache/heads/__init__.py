"""Trainable heads; importing this package fills ``HEADS``."""
from fedcache.heads import linear, mlp, projection  # noqa: F401  (registration)
from fedcache.heads.base import HEADS, Head, Params, as_rows, expand, forward, make_head, stack, train_forward, unstack

__all__ = ["HEADS", "Head", "Params", "as_rows", "expand", "forward", "make_head", "stack", "train_forward", "unstack"]

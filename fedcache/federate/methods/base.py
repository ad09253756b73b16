"""The method interface: a method says what a client does, what the server does, and what travels.

The round driver (federate/driver.py) owns sampling, byte counting, evaluation, checkpoints and
resumption; a method never touches those. Client state is read and written as if stacked over all
clients (leading axis N: ``federate/clients.py`` holds it) so an engine can hand any subset of clients to
``local_update`` at once, which returns every entry of the states it was given.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from fedcache.config import Checked, check_fields
from fedcache.errors import ConfigError
from fedcache.federate.data import FederatedData
from fedcache.federate.methods import METHODS, MethodRegistry  # noqa: F401  (the package's: it imports no torch)
from fedcache.federate.optim import OptimConfig
from fedcache.federate.schedule import Schedule
from fedcache.heads import Head, Params, make_head
from fedcache.heads.draws import ClientHeads
from fedcache.wording import given_in_file, named


@dataclass(frozen=True)
class NoSettings(Checked):
    pass


@dataclass
class MethodContext:
    """What a method is built on: the federation's data, and the head, optimizer and schedule sections of
    the run specification."""

    data: FederatedData
    head: str = "linear"
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    schedule: Schedule = dataclasses.field(default_factory=Schedule)

    @property
    def seed(self) -> int:
        return self.schedule.seed

    @property
    def local_epochs(self) -> int:
        return self.schedule.local_epochs

    @property
    def batch_size(self) -> int:
        return self.schedule.batch_size

    @property
    def rounds(self) -> int:
        return self.schedule.rounds


@dataclass
class LocalResult:
    states: Params  # new personal state of the K clients (stacked)
    uploads: Params  # what the K clients send (stacked)
    weights: torch.Tensor  # (K,) aggregation weights, usually sample counts


@dataclass(frozen=True)
class CommandOption:
    """An option of a method's command that is not a run-spec option (e.g. the PNG to write)."""

    name: str
    type: type
    help: str
    flags: tuple[str, ...] = ()  # default: --<name> in kebab-case
    default: Any = ...  # ...: required


@dataclass(frozen=True)
class MethodCommand:
    """A command that belongs to one method (FedPCL's backbone heatmap): ``fedcache <name>`` takes the run-spec
    options named in ``spec_options`` (with the command's own ``defaults``) and its ``extra`` options, and calls
    ``run(spec, **extra)`` with the method set to the owner's; ``run`` returns the lines to print. ``run`` is
    the function, or ``"module:function"`` where its code lives in a layer above the methods (a report that
    trains runs, say), imported when the command runs. The CLI builds the command from this hook
    (fedcache/cli/methods.py), so a method adds commands without touching the CLI."""

    name: str
    help: str
    run: Callable[..., list[str]] | str
    spec_options: tuple[str, ...]
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    extra: tuple[CommandOption, ...] = ()
    example: str = ""  # a command line shown under its help ("fedcache <name> ..."); tests parse it

    def function(self) -> Callable[..., list[str]]:
        if not isinstance(self.run, str):
            return self.run
        import importlib

        module, _, name = self.run.partition(":")
        return getattr(importlib.import_module(module), name)


class Method:
    name: ClassVar[str] = ""  # set by the registration (METHODS.register), never by the class
    description: ClassVar[str] = ""
    Settings: ClassVar[type] = NoSettings
    default_head: ClassVar[str] = "linear"
    # The heads it can run with, when not every head: its algorithm is defined on these (--head anything else is refused).
    heads: ClassVar[tuple[str, ...]] = ()
    default_preset: ClassVar[str] = "default"  # optimizer preset (optim_config.OPTIMIZER_PRESETS) of the paper it is compared in
    personalized: ClassVar[bool] = False  # predictions differ per client
    has_global_model: ClassVar[bool] = True  # a model the global test set can be scored on
    server_by_client: ClassVar[tuple[str, ...]] = ()  # server entries with a row per client, not one model's
    federated: ClassVar[bool] = True  # False: no communication (solo, centralized, linear-probe)
    # Trains on every client's rows in one place (centralized, linear-probe): the ceiling federated methods are read
    # against, so tables and reports mark the best among the methods that keep data on clients (fedcache/best.py).
    pools_data: ClassVar[bool] = False
    # local_update(clients) equals local_update per client, concatenated: the loop path exists and
    # must agree with the batched path. False for methods that pool all clients (centralized).
    splittable: ClassVar[bool] = True
    all_clients: ClassVar[bool] = False  # every client trains every round, whatever --fraction says
    # Why the method needs a head with representation layers (non-empty body_keys), if it does.
    needs_representation: ClassVar[str] = ""
    # Trains on the augmented views (``extract --views K``): ``fedcache train`` then loads them into data.views.
    uses_views: ClassVar[bool] = False
    # False for methods that fit nothing by gradient steps (clip-zs, linear-probe): optim.* settings are refused.
    uses_optimizer: ClassVar[bool] = True
    # Uploads that are per-class row counts, which aggregate() weights by: a deployment's server checks
    # they are whole, non-negative and sum to at most the client's training rows (fedcache/flower/replies.py).
    count_uploads: ClassVar[tuple[str, ...]] = ()
    # Commands of this method beyond train (``fedcache <command.name>``), built by the CLI from the hook.
    commands: ClassVar[tuple[MethodCommand, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "Params" in vars(cls):  # the name before 0.1.0: it would be ignored, and the method's settings unknown
            raise TypeError(f"{cls.__name__}: a method's settings class is its `Settings` attribute; rename `Params = "
                            f"{getattr(vars(cls)['Params'], '__name__', '...')}` to `Settings = ...`")

    def __init__(self, ctx: MethodContext, params: Any = None) -> None:
        check_head(type(self), self.name, ctx.head)
        self.ctx = ctx
        self.p = params if params is not None else self.Settings()
        check_fields(self.p)
        d = ctx.data
        self.head: Head = make_head(ctx.head, d.dim, d.n_classes)
        if self.needs_representation and not self.head.body_keys:
            mlp = named("--head mlp", "head='mlp'")
            raise ConfigError(
                f"{self.name} {self.needs_representation}; the {ctx.head!r} head has no representation layers "
                f"(its representation is the frozen embedding itself): use {mlp}"
            )

    @classmethod
    def not_deployable(cls, params: Any) -> str:
        """Why this method, with these settings, cannot run with each client's data on its own machine
        (Flower); empty when it can."""
        return "" if cls.splittable else "it pools every client's data in one place"

    # ---- state ------------------------------------------------------------------
    def generator(self, *path: int) -> torch.Generator:
        seed = int(np.random.SeedSequence([self.ctx.seed, *path]).generate_state(1)[0])
        return torch.Generator().manual_seed(seed)

    def init_server(self) -> Params:
        return self.head.init(1, self.generator(0, 0))

    def init_clients(self, n: int) -> Params:
        """Personal state of all N clients, stacked; empty for methods without one. A method whose clients' initial
        states can be made one client at a time defines ``initial_states`` instead."""
        states = self.initial_states(list(range(n)))
        return {} if states is None else states

    def initial_states(self, clients: list[int]) -> Params | None:
        """The initial personal state of these clients alone, stacked (K, ...) (a run of thousands of clients then
        holds only those a round has trained: federate/clients.py); None where only ``init_clients`` can make it."""
        return None

    def client_heads(self, clients: list[int]) -> Params | None:
        """These clients' rows of ``self.head.init(n, self.generator(0, 1))``, every client's own random head drawn
        from one stream, made without the others' (heads/draws.py); None for a head that does not list its
        parameters."""
        if not hasattr(self, "_client_heads"):
            self._client_heads = ClientHeads.of(self.head, self.ctx.data.n_clients, lambda: self.generator(0, 1))
        return None if self._client_heads is None else self._client_heads.rows(clients)

    # ---- one round ----------------------------------------------------------------
    def broadcast(self, server: Params, rnd: int) -> Params:
        """What every sampled client receives."""
        return server

    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        raise NotImplementedError

    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        return server

    def upload_size(self, uploads: Params, i: int) -> tuple[int, int]:
        """(parameters, bytes) client i of the batch sends; by default every uploaded tensor, whole."""
        return tensor_size({n: t[i] for n, t in uploads.items()})

    def download_size(self, down: Params) -> tuple[int, int]:
        return tensor_size(down)

    # ---- evaluation ------------------------------------------------------------------
    def summary_extra(self) -> dict:
        """Method-specific facts for the run summary (e.g. that a run bypassed the feature cache)."""
        return {}

    def client_logits(self, server: Params, states: Params, clients: list[int], x: torch.Tensor) -> torch.Tensor:
        """(K, T, D) local test features of K clients -> (K, T, C) scores; personalised methods override."""
        logits = self.global_logits(server, x.flatten(0, 1))
        return logits.view(*x.shape[:2], -1)

    def scores_by_own_state(self) -> bool:
        """Whether ``client_logits`` reads a client's own state and rows alone, nothing of the server's: then a
        client no round has trained scores the same at every evaluation (its state is the initial one), and is
        scored once (``inprocess.client_accuracy``). False where a client's scores follow the global model."""
        return False

    def global_logits(self, server: Params, x: torch.Tensor) -> torch.Tensor:
        """(N, D) -> (N, C) with the global model."""
        from fedcache.heads import forward

        with torch.no_grad():
            return forward(self.head, server, x.unsqueeze(0))[0]

    # ---- helpers for subclasses ----------------------------------------------------------
    def trainable(self, params: Params) -> tuple[str, ...]:
        return tuple(n for n in params if n not in self.head.buffer_keys)

    def fit(self, params: Params, rnd: int, clients: list[int], loss_fn, extra: dict | None = None,
            keys: tuple[str, ...] | None = None, epochs: int | None = None) -> Params:
        """Train the K clients' stacked ``params`` on their own rows (the batched local step)."""
        from fedcache.federate.local import train

        c = self.ctx
        plan = self.plan(rnd, clients, epochs)
        keys = self.trainable(params) if keys is None else keys
        return train(params, keys, loss_fn, c.data.x_train, c.data.y_train, plan, c.optim, extra)

    def ce_loss(self, p: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, info: dict) -> tuple[torch.Tensor, Params]:
        """Cross-entropy of a training step, and the head's new buffers."""
        from fedcache.federate.local import cross_entropy
        from fedcache.heads import train_forward

        logits, buffers = train_forward(self.head, p, xb, mask)
        return cross_entropy(logits, yb, mask), buffers

    def plan(self, rnd: int, clients: list[int], epochs: int | None = None, first_epoch: int = 0) -> np.ndarray:
        """The (K, S, B) mini-batch plan ``fit`` follows, for methods that run their own step loop
        (epochs numbered from ``first_epoch``: see ``local.step_plan``)."""
        from fedcache.federate.local import step_plan

        c = self.ctx
        return step_plan(self.client_rows(clients), c.batch_size, c.local_epochs if epochs is None else epochs, c.seed, rnd,
                         clients, first_epoch)

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Training rows ``idx`` (K, B), -1 for padding -> (xb, yb, mask)."""
        d = self.ctx.data
        return d.train_features(idx.clamp_min(0)), d.y_train[idx.clamp_min(0)], idx >= 0

    def client_rows(self, clients: list[int]) -> list[np.ndarray]:
        return [self.ctx.data.client_train[k] for k in clients]

    def sample_counts(self, clients: list[int]) -> torch.Tensor:
        return torch.tensor([len(self.ctx.data.client_train[k]) for k in clients], dtype=torch.float32)


def head_named() -> str:
    """The head option as the caller gave it, to drop: the flag, the API's keyword, or a grid file's [set] key."""
    return given_in_file("head.name") or named("--head", "head=")


def check_head(cls: type, name: str, head: str) -> None:
    """Refuse a head the method does not run with (its ``heads``), when its spec is made and when it is built."""
    heads = getattr(cls, "heads", ())
    if heads and head not in heads:
        raise ConfigError(f"{name} runs with the {' or '.join(heads)} head only, not {head!r}; drop "
                          f"{head_named()} (in a grid of several methods, give {name} a grid of its own)")


def tensor_size(tensors: Params) -> tuple[int, int]:
    """(parameters, bytes) of the tensors as they travel: every tensor whole."""
    n = sum(int(t.numel()) for t in tensors.values())
    return n, sum(int(t.numel()) * t.element_size() for t in tensors.values())


def gradients(loss_fn, params: Params, keys: tuple[str, ...], batch: tuple, info: dict | None = None) -> tuple[Params, Params]:
    """Each client's loss gradient w.r.t. ``keys`` (zero where unused), and ``params`` with the
    buffers (BatchNorm statistics) the forward pass updated. The per-client losses are summed:
    parameters are per client, so each client's gradient is its own."""
    from fedcache.federate.local import split_loss

    leaves = {n: params[n].detach().requires_grad_(True) for n in keys}
    loss, buffers = split_loss(loss_fn({**params, **leaves}, *batch, info or {}))
    grads = torch.autograd.grad(loss.sum(), list(leaves.values()), allow_unused=True)
    grads = {n: (g if g is not None else torch.zeros_like(leaves[n])) for n, g in zip(leaves, grads)}
    return grads, {n: t.detach() for n, t in {**params, **buffers}.items()}


def weighted_average(stacked: Params, weights: torch.Tensor) -> Params:
    """FedAvg's aggregation: (K, ...) -> (1, ...) weighted by ``weights``."""
    w = weights / weights.sum()
    return {n: torch.einsum("k,k...->...", w, t).unsqueeze(0) for n, t in stacked.items()}


def aggregation_weights(kind: str, counts: torch.Tensor) -> torch.Tensor:
    """The server's weights of the sampled clients: equal ("uniform": the pFedMe, Per-FedAvg and FedRep papers'
    algorithms) or by training samples ("samples": the pFedMe repository's code and FedAvg)."""
    return counts if kind == "samples" else torch.ones_like(counts)

"""FST-CBDG (Yan & Guo, "Lightweight Unsupervised Federated Learning with Pretrained Vision Language
Model"): federated self-training of a text-initialised linear classifier on *unlabelled* clients.

Each client keeps soft pseudo-labels over its own rows (initialised with the zero-shot probabilities,
refreshed by a moving average at every local step) and trains on them plus class-balanced
synthetic instances drawn around the class anchors; the server averages W and b (FedAvg). Client
labels are never read: training sees a blank label vector.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from fedcache.config import Checked, Fraction, NonNegative, PositiveInt
from fedcache.federate.local import here, train
from fedcache.federate.methods import _fst_cbdg as cbdg
from fedcache.federate.methods._clip import (anchor_head, cosine, linear_logits, prototype_anchors, require_linear,
                                             unit, unit_logits)
from fedcache.federate.methods.base import METHODS, LocalResult, Method, MethodContext, weighted_average
from fedcache.federate.prototypes import padded_rows
from fedcache.federate.text import text_from_info
from fedcache.federate.stacking import per_run, stackable
from fedcache.heads import Params, expand

# (weight of L_iST, weight of lambda * L_tSamp) per ablation of Table 3
LOSS_WEIGHTS = {"both": (1.0, 1.0), "ist": (1.0, 0.0), "tsamp": (0.0, 1.0)}
ZERO_SHOT_CHUNK = 8192  # rows per matrix product when computing the initial pseudo-labels


@dataclass(frozen=True)
class FSTCBDGSettings(Checked):
    beta: Fraction = 0.9  # Eq. 4 moving-average rate; paper Sec. 4.1
    lam: NonNegative = 1.0  # lambda of Eq. 8; paper Sec. 4.1
    gamma: NonNegative = 0.0  # Eq. 7; paper Sec. 4.1
    # Per-coordinate std of N(T_k, sigma^2 I) (Eq. 5); the paper does not state it. Chosen on a
    # validation split of real features (docs/methods/fst-cbdg.md, "Choosing sigma").
    sigma: NonNegative = 0.02
    losses: Literal["both", "ist", "tsamp"] = "both"  # Table 3 ablation
    # How a step weighs its synthetic instances (cbdg.tsamp_loss): epoch = every instance of the epoch alike,
    # L_tSamp their mean; sum = Eq. 6 read literally (their sum); step = the mean over each step's own draws.
    tsamp_weight: Literal["epoch", "sum", "step"] = "epoch"
    sampling: Literal["balanced", "equal"] = "balanced"  # Table 4 ablation
    anchors: Literal["text", "prototypes"] = "text"  # prototypes: extension for backbones without text
    templates: Literal["single", "ensemble"] = "single"  # Algorithm 1: "a photo of a {object}."
    shots: PositiveInt = 16  # labelled rows per class the server averages for anchors=prototypes
    refresh: Literal["all", "batch"] = "all"  # rows whose pseudo-labels each step refreshes (cbdg.LocalPass.refresh)
    # How Eq. 5's instances are drawn: "explicit" draws each D-dimensional z; "implicit" draws only what a
    # linear head's logits and gradients depend on (the same distribution, D/C times fewer numbers).
    synthetic: Literal["implicit", "explicit"] = "implicit"

    def ignored(self) -> dict[str, str]:
        """Settings this configuration does not read: ``--set`` refuses them instead of dropping them.
        (lam = 0 switches L_tSamp off too, but a zero weight is a point of a sweep: not refused there.)"""
        out = {}
        if self.losses == "ist":
            why = "losses=ist draws no synthetic instances (no L_tSamp)"
            out.update({k: why for k in ("gamma", "sigma", "sampling", "tsamp_weight", "synthetic")})
        if self.anchors == "text":
            out["shots"] = "anchors=text builds the anchors from class names; shots counts rows for anchors=prototypes"
        else:
            out["templates"] = "anchors=prototypes builds the anchors from labelled rows, not from text templates"
        return out


def positions(plan: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
    """The (K, S, B) plan's rows as positions in each client's row list (-1 stays): where each row's
    pseudo-label sits."""
    pos = np.full_like(plan, -1)
    for i, r in enumerate(rows):
        order = np.argsort(r, kind="stable")
        real = plan[i] >= 0
        pos[i][real] = order[np.searchsorted(r, plan[i][real], sorter=order)]
    return pos


ANCHORS = {
    "text": lambda m: text_from_info(m.ctx.data, m.name, m.p.templates, without={"anchors": "prototypes"}),
    "prototypes": lambda m: prototype_anchors(m.ctx.data, m.p.shots, m.ctx.seed),
}


def _stack_memory(params: FSTCBDGSettings, rows: int, clients: int, dim: int, n_classes: int, batch: int) -> int:
    # Pseudo-labels (N, n_max, C), n_max up to every row, three copies in a local pass (the state, the
    # pass's, the returned one); with refresh=all the unit features of the clients' rows, in pieces (each client's
    # last padded: under 64 rows) with a copy of the head per piece.
    pieces = (rows + clients * cbdg.WIDTHS[1]) * dim + (rows // cbdg.WIDTHS[1] + clients) * dim * n_classes
    return 4 * (3 * clients * rows * n_classes + (pieces if params.refresh == "all" else 0))


@METHODS.register("fst-cbdg")
# Eq. 5-7's settings and the anchors are read only in tsamp (@per_run) and in each run's own __init__, so they may
# differ between stacked runs. beta is not per row: Eq. 4's 1 - beta, a float64 number in a run, would round
# differently as a float32 row value.
@stackable(per_run=("lam", "gamma", "sigma", "sampling", "tsamp_weight", "synthetic", "anchors", "shots"),
           padded_states=("q",), memory=_stack_memory)
class FSTCBDG(Method):
    description = "unsupervised: self-training on zero-shot soft pseudo-labels + class-balanced text sampling"
    Settings = FSTCBDGSettings
    default_preset = "fst-cbdg"

    @classmethod
    def not_deployable(cls, params: FSTCBDGSettings) -> str:
        if params.anchors == "prototypes":
            return ("anchors=prototypes averages labelled rows drawn from every client on the server, which a "
                    "deployment's server does not hold; use anchors=text")
        return super().not_deployable(params)

    def __init__(self, ctx: MethodContext, params=None) -> None:
        require_linear(ctx.head, "fst-cbdg")
        super().__init__(ctx, params)
        self.anchors = ANCHORS[self.p.anchors](self)
        self.w_ist, self.w_tsamp = LOSS_WEIGHTS[self.p.losses]
        # Labels never reach training: train() indexes this blank vector instead of y_train.
        self.blind = torch.zeros((), dtype=torch.long).expand(len(ctx.data.x_train))
        self._zero_shot: torch.Tensor | None = None
        self._width = 0

    def init_server(self) -> Params:
        return anchor_head(self.anchors)

    def initial_states(self, clients: list[int]) -> Params:
        """q^0 = p (Eq. 2): the zero-shot probabilities of each client's rows, padded to the run's largest client
        (K, n_max, C)."""
        rows = self.ctx.data.client_train
        if self._zero_shot is None:  # every row's, once: a client's q^0 is read when it first trains
            d = self.ctx.data
            every = torch.arange(len(d.x_train), device=d.x_train.device)
            self._zero_shot = torch.cat([torch.softmax(cosine(d.train_features(r), self.anchors.T), -1)
                                         for r in every.split(ZERO_SHOT_CHUNK)])
            self._width = max((len(r) for r in rows), default=0)
        idx, mask = padded_rows([rows[k] for k in clients], self._width)
        here = self._zero_shot.device  # the run's, also when read after it (ClientStates moves it there anyway)
        return {"q": self._zero_shot[idx.to(here)] * mask.to(here).unsqueeze(-1)}

    # ---- client ---------------------------------------------------------------------
    def local_update(self, rnd: int, clients: list[int], down: Params, states: Params) -> LocalResult:
        c = self.ctx
        rows = self.client_rows(clients)
        plan = self.plan(rnd, clients)
        _, valid = padded_rows(rows)
        x = cbdg.RowPieces.of([unit(c.data.train_features(here(r))) for r in rows]) if self.p.refresh == "all" else None
        lp = cbdg.LocalPass.start(states["q"], here(positions(plan, rows)), valid, x, self.streams(rnd, clients))
        info = {"pass": lp, "sizes": valid.sum(1).clamp_min(1)}
        params = train(expand(down, len(clients)), ("weight", "bias"), self.loss, c.data.x_train, self.blind, plan,
                       c.optim, info)
        return LocalResult({"q": lp.write_into(states["q"])}, params, self.sample_counts(clients))

    @per_run()
    def streams(self, rnd: int, clients: list[int]) -> list[torch.Generator]:
        """Each client's random stream for its synthetic instances this round."""
        return cbdg.LocalPass.streams(self.ctx.seed, rnd, clients)

    def loss(self, p: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, info: dict) -> torch.Tensor:
        """L_iST + lambda L_tSamp (Eq. 8) of one step. Algorithm 1 refreshes the pseudo-labels and draws
        the synthetic instances inside each iteration (lines 14-17): train() calls this once per step,
        so this is where the pass's pseudo-labels (info["pass"].q) are updated."""
        lp: cbdg.LocalPass = info["pass"]
        s = info["step"]
        logits = linear_logits(p, unit(xb))
        lp.refresh(self.p.refresh, s, p, logits, mask, self.p.beta)
        total = self.w_ist * cbdg.soft_cross_entropy(logits, lp.batch_q(s), mask)
        if self.w_tsamp:
            share = mask.sum(1) / info["sizes"]  # this batch's fraction of the client's epoch
            total = total + self.tsamp(p, lp.q, lp.valid, share, lp.gens)
        return total

    @per_run("p", "q", "valid", "share", "gens")
    def tsamp(self, p: Params, q: torch.Tensor, valid: torch.Tensor, share: torch.Tensor, gens: list) -> torch.Tensor:
        """lambda L_tSamp of one step (Eq. 5-7): class-balanced synthetic instances drawn around the anchors,
        ``share`` of the epoch's. A step's instances are padded to its client with the most draws, and that
        width decides how sums round, so the draws are always of one run's clients."""
        weight = self.w_tsamp * self.p.lam
        if weight == 0:  # a client draws nothing, as L_tSamp switched off
            return torch.zeros(len(share))
        n = cbdg.SAMPLING[self.p.sampling](cbdg.pseudo_counts(q, valid), self.p.gamma)
        y, m = cbdg.draw_classes(n, share, gens)
        logits = cbdg.SYNTHETIC[self.p.synthetic](p, y, m, self.anchors, self.p.sigma, gens)
        return weight * cbdg.tsamp_loss(logits, y, m, n, share, self.p.tsamp_weight)

    # ---- server / evaluation ---------------------------------------------------------------
    def aggregate(self, server: Params, result: LocalResult, clients: list[int], rnd: int) -> Params:
        return weighted_average(result.uploads, result.weights)

    def global_logits(self, server: Params, x: torch.Tensor) -> torch.Tensor:
        return unit_logits(server, x)


"""CoOp-style text prompts for promptfl, tpfl and atpfl: learnable context vectors run through the
frozen text tower of the very CLIP that produced the cached image features.

The prompt of class c is ``[SOS] ctx_1 .. ctx_M <tokens of c> . [EOS]`` (CoOp's "end" class-token
position); ctx is shared by all classes (CoOp's unified context), one copy per client.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from fedcache.errors import ConfigError
from fedcache.federate.data import FederatedData
from fedcache.federate.source import source_from_info
from fedcache.heads.base import bmm
from fedcache.wording import pasted, setting

CTX_STD = 0.02  # CoOp's random initialisation of the context vectors
PLACEHOLDER = "X"  # CoOp's stand-in word for a context position before its embedding is replaced

if TYPE_CHECKING:
    from fedcache.extract.backbones import LoadedBackbone


def load_clip(data: FederatedData, method: str, weights: str = "") -> LoadedBackbone:
    """The CLIP the features were extracted with, checked against the weights hash in the store entry."""
    # Imported here: every method module is imported with the registry, and the image-loading side of
    # fedcache.extract costs a Flower ClientApp, started afresh for every message, about 0.25 s.
    from fedcache.extract.backbones import BACKBONES
    from fedcache.extract.loading import load_backbone

    name, recorded = source_from_info(data, method).backbone(method)
    spec = BACKBONES.get(name)
    if not spec.has_text:
        raise ConfigError(f"{method} learns text prompts, but {name} has no text tower; use a CLIP backbone")
    # Features extracted with --random-init carry random weights their spec does not: rebuild those.
    random_init = data.random_weights and not spec.random_weights
    bb = load_backbone(name, Path(weights).expanduser() if weights else None, random_init=random_init)
    if bb.model is None or bb.tokenize is None:
        raise ConfigError(f"{method}: the {spec.source} loader of {name} does not expose its text tower")
    if bb.weights_hash != recorded:
        source = source_from_info(data, method)
        raise ConfigError(_not_these_weights(bb, recorded, method, source.keys()[0], source.store))
    return bb


def _not_these_weights(bb: LoadedBackbone, recorded: str, method: str, key: dict, store: Path | None = None) -> str:
    from fedcache.extract.backbones.base import hash_state

    name = key["backbone"]
    at = f" {pasted('--store', store)}" if store is not None else ""
    if hash_state(bb.model) == recorded:  # the same tensors hashed as before the activation was part of the hash
        return (f"{method}: the cached {name} features were extracted before fedcache ran OpenAI's CLIPs with "
                f"QuickGELU, the activation they were trained with, so they are not this model's features; extract "
                f"them again (`fedcache extract{at} {pasted('--dataset', key['dataset'], '--backbones', name)}` with the "
                f"options they were made with), then `fedcache store rm --stale{at}` removes the old ones")
    return (f"{method}: the {name} weights loaded here (hash {bb.weights_hash}) are not the ones the cached features "
            f"were extracted with (hash {recorded}); pass the same checkpoint with {setting('method.weights')}=PATH")


def logit_scale(bb: LoadedBackbone, override: float) -> float:
    """CLIP's learned temperature exp(t) (100 for OpenAI's weights), unless the user fixes one."""
    return float(override) if override > 0 else float(bb.model.logit_scale.exp())


class PromptedText:
    """Class-text features of K contexts at once: (K, M, W) -> (K, C, D), all K*C prompts in one pass."""

    def __init__(self, bb: LoadedBackbone, class_names, n_ctx: int) -> None:
        if n_ctx < 1:
            raise ConfigError(f"n_ctx must be >= 1, got {n_ctx}")
        m = bb.model
        self.model, self.n_ctx = m, n_ctx
        self.pool = m.text_pool_type
        self.eos = getattr(m, "text_eos_id", None)
        tokens = bb.tokenize([" ".join([PLACEHOLDER] * n_ctx) + f" {c}." for c in class_names])
        placeholder = bb.tokenize([PLACEHOLDER])[0, 1]
        if not bool((tokens[:, 1: 1 + n_ctx] == placeholder).all()):
            raise ConfigError("the tokenizer does not map each context placeholder to one token")
        length = self._length(tokens)
        self.tokens = tokens[:, :length].to(m.positional_embedding.device)
        with torch.no_grad():
            emb = m.token_embedding(self.tokens)
        self.prefix, self.suffix = emb[:, :1], emb[:, 1 + n_ctx:]
        self.mask = m.attn_mask[:length, :length] if m.attn_mask is not None else None
        self.pos = m.positional_embedding[:length]

    def _length(self, tokens: torch.Tensor) -> int:
        """Positions the encoder must run. With a causal mask the pooled EOS output cannot see later
        (padding) positions, so cutting after the last EOS gives the same features, 4-5x faster
        (RN50 text tower, 10 classes, 20 instead of 77 positions; docs/methods/promptfl.md)."""
        if self.model.attn_mask is None or self.pool not in ("argmax", "eos"):
            return tokens.shape[1]
        end = tokens.argmax(-1) if self.pool == "argmax" else (tokens == self.eos).int().argmax(-1)
        return int(end.max()) + 1

    @property
    def width(self) -> int:
        return int(self.prefix.shape[-1])

    def init_context(self, text: str, bb: LoadedBackbone, gen: torch.Generator) -> torch.Tensor:
        """(1, M, W): CoOp's N(0, 0.02^2) draw, or the word embeddings of ``text`` (e.g. "a photo of a")."""
        if not text:
            return (torch.randn(1, self.n_ctx, self.width, generator=gen, device=gen.device) * CTX_STD).to(self.prefix.device)
        tokens = bb.tokenize([text]).to(self.tokens.device)
        n = int(tokens[0].argmax()) - 1  # between SOS and EOS
        if n != self.n_ctx:
            raise ConfigError(f"ctx_init {text!r} is {n} tokens; set n_ctx={n} to initialise from it")
        with torch.no_grad():
            return self.model.token_embedding(tokens)[:, 1: 1 + n].float().cpu()

    def encode(self, ctx: torch.Tensor) -> torch.Tensor:
        """(K, M, W) contexts -> (K, C, D) unit text features, differentiable in ctx only."""
        k, c, home = ctx.shape[0], self.tokens.shape[0], ctx.device
        ctx = ctx.to(self.prefix.device)  # the tower may sit on a GPU (device=cuda); autograd follows the copy
        x = torch.cat([self.prefix.expand(k, -1, -1, -1), ctx.unsqueeze(1).expand(-1, c, -1, -1),
                       self.suffix.expand(k, -1, -1, -1)], dim=2).flatten(0, 1)
        from open_clip.transformer import text_global_pool  # lazy: importing open_clip costs seconds

        m = self.model
        x = m.transformer(x + self.pos, attn_mask=self.mask)
        x = text_global_pool(m.ln_final(x), self.tokens.repeat(k, 1), self.pool, eos_token_id=self.eos)
        proj = m.text_projection
        x = proj(x) if isinstance(proj, torch.nn.Linear) else (x @ proj if proj is not None else x)
        return F.normalize(x.float(), dim=-1).view(k, c, -1).to(home)


def prompt_logits(image: torch.Tensor, text: torch.Tensor, scale: float) -> torch.Tensor:
    """(K, B, D) unit image features, (K, C, D) unit text features -> (K, B, C) CLIP logits."""
    return scale * bmm(image, text.transpose(1, 2))


def info_nce(z: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, tau: float) -> torch.Tensor:
    """ATPFL Eq. 4 per row: -log e^{s(z,z_g)/tau} / (e^{s(z,z_g)/tau} + e^{s(z,z_prev)/tau}), s = cosine."""
    pos = F.cosine_similarity(z, positive, dim=-1) / tau
    neg = F.cosine_similarity(z, negative, dim=-1) / tau
    return -(pos - torch.logaddexp(pos, neg))

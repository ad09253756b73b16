"""Where the prompt methods get image features from, with or without a visual prompt.

Every kind maps rows of ``x_train`` (training) or an evaluation tensor to (.., D) unit image features:
``cached`` (promptfl): the cached features; ``feature`` (tpfl/atpfl default): the cached feature plus
a learned additive prompt v in R^D, TPFL's "x + v" moved from pixels to the embedding space;
``pixel``: TPFL's padding prompt on the preprocessed image, through CLIP's frozen image tower. The
pixel kind re-reads the raw images, so it bypasses the cache (GPU recommended).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from fedcache.errors import ConfigError
from fedcache.federate.data import FederatedData
from fedcache.federate.source import FeatureSource, RowSource
from fedcache.store.keys import source_fingerprint

EVAL_CHUNK = 256  # images per no-grad forward when scoring the pixel prompt


class CachedFeatures:
    """No visual prompt: the cached features themselves (promptfl)."""

    bypasses_cache = False

    def __init__(self, data: FederatedData) -> None:
        self.data = data

    def init(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {}

    def train_features(self, p: dict, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(K, B) training rows (``mask``: the real ones) -> (K, B, D) unit features."""
        return F.normalize(self.data.train_features(rows), dim=-1)

    def eval_features(self, p: dict, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)


class FeaturePrompt(CachedFeatures):
    """z + v on the cached (un-normalised) embedding, v in R^D per client, initialised at 0 so that
    round 1 starts from the plain features."""

    def init(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"vprompt": torch.zeros(1, self.data.dim)}

    def train_features(self, p: dict, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.data.train_features(rows) + p["vprompt"].unsqueeze(1), dim=-1)

    def eval_features(self, p: dict, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x + p["vprompt"][0], dim=-1)


class ImageRows:
    """The raw images behind cached rows, preprocessed as at extraction (plain view), kept as uint8."""

    def __init__(self, src: FeatureSource, dataset: str, data_root: str) -> None:
        # Imported here: only pixel mode reads images, and torchvision costs seconds to import.
        from fedcache.extract.datasets import DatasetOptions
        from fedcache.extract.loading import load_dataset
        from fedcache.extract.transforms import Preprocess

        keys = src.keys()
        name = dataset or keys[0]["dataset"]
        self.dataset = load_dataset(name, DatasetOptions(data_root=data_root or None))
        pres = {str(k["preprocess"]) for k in keys}
        if len(pres) != 1:
            raise ConfigError("visual=pixel: the cached entries were preprocessed differently; re-extract them alike")
        self.pre = Preprocess.from_dict(keys[0]["preprocess"])
        if self.pre.noise != "none":
            raise ConfigError("visual=pixel does not re-apply the image noise of a privacy-study extraction")
        self.src, self.cache = src, {}
        self.positions = {role: self._positions(getattr(src, role)) for role in ("train", "test")}

    def _positions(self, rows: RowSource) -> np.ndarray:
        """Row -> (samples, position in them), checking that the images are the cached ones."""
        out = np.empty(len(rows.ids), dtype=object)
        for key in rows.keys:
            s = self.dataset.samples(key["split"], key["domain"])
            if s.fingerprint() != source_fingerprint(key["dataset_fingerprint"]):  # a Flower shard's entry too
                raise ConfigError(f"visual=pixel: the images of {key['dataset']}/{key['split']}/{key['domain']} "
                                  "differ from the ones the features were extracted from (other data_root or seed?)")
            lookup = {int(i): j for j, i in enumerate(s.ids)}
            for r in np.flatnonzero(rows.domains == self.src.domain_names.index(key["domain"])):
                out[r] = (s, lookup[int(rows.ids[r])])
        return out

    def get(self, role: str, rows: np.ndarray) -> torch.Tensor:
        """(...) row indices -> (..., 3, S, S) normalised float images."""
        flat = [self._uint8(role, int(r)) for r in rows.reshape(-1)]
        x = self.pre.normalize(torch.stack(flat))
        return x.view(*rows.shape, *x.shape[1:])

    def _uint8(self, role: str, row: int) -> torch.Tensor:
        if (role, row) not in self.cache:
            samples, pos = self.positions[role][row]
            self.cache[(role, row)] = self.pre.plain()(samples.source.load(int(pos)))
        return self.cache[(role, row)]


class PixelPrompt(CachedFeatures):
    """A padding prompt (Bahng et al. 2022, TPFL's "padding" template): a learnable frame ``pad``
    pixels wide added to the normalised image; only the frame's 3 * (S^2 - (S - 2 pad)^2) values exist."""

    bypasses_cache = True

    def __init__(self, data: FederatedData, src: FeatureSource, model, pad: int, dataset: str, data_root: str,
                 device: torch.device) -> None:
        super().__init__(data)
        self.images = ImageRows(src, dataset, data_root)
        s = self.images.pre.size
        if not 0 < pad < s / 2:
            raise ConfigError(f"visual=pixel needs 0 < pad < {s / 2} for {s}-pixel images, got pad={pad}")
        frame = torch.ones(s, s, dtype=torch.bool)
        frame[pad: s - pad, pad: s - pad] = False
        self.border, self.size, self.model, self.device = frame.flatten().nonzero().squeeze(1), s, model, device

    def init(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"vprompt": torch.zeros(1, 3, len(self.border))}

    def _encode(self, v: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """(K, 3, P) frames, (K, B, 3, S, S) images -> (K, B, D) unit features of the prompted images."""
        k, b = images.shape[:2]
        frame = v.new_zeros(k, 3, self.size * self.size).index_copy(2, self.border, v)
        x = images + frame.view(k, 1, 3, self.size, self.size)
        z = self.model.encode_image(x.flatten(0, 1).to(self.device)).float().cpu()
        return F.normalize(z, dim=-1).view(k, b, -1)

    def train_features(self, p: dict, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Only the step's real rows go through the image tower (a step is the full batch width, and a short
        client's padding rows would cost whole forward and backward passes); padding rows get zeros."""
        real = mask.nonzero(as_tuple=True)
        out = torch.zeros(*rows.shape, self.data.dim)
        if len(real[0]):
            # One prompted image per real row, each with its own client's frame.
            z = self._encode(p["vprompt"][real[0]], self.images.get("train", rows[real].cpu().numpy())[:, None])
            out = out.index_put(real, z[:, 0])
        return out

    def _rows_of(self, x: torch.Tensor) -> tuple[str, np.ndarray]:
        """Which split's rows ``x`` holds, and which of its rows: the images are read from the store's sources."""
        d = self.data
        if x is d.x_test or x is d.x_train:
            return ("test" if x is d.x_test else "train"), np.arange(len(x))
        if d.global_rows is not None and x is d.scored_test():
            return "test", d.global_rows
        raise ConfigError("visual=pixel scores images, so it can only be evaluated on the run's own splits")

    def eval_features(self, p: dict, x: torch.Tensor) -> torch.Tensor:
        role, rows = self._rows_of(x)
        with torch.no_grad():
            return torch.cat([self._encode(p["vprompt"], self.images.get(role, rows[i: i + EVAL_CHUNK])[None])[0]
                              for i in range(0, len(rows), EVAL_CHUNK)])

"""``--set``: every key reaches the object it names, ambiguous and unused keys are refused, ranges hold."""
from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Literal

import pytest

from fedcache.errors import ConfigError
from fedcache.federate.methods import METHODS, MethodContext
from fedcache.federate.optim import OptimConfig
from fedcache.config import Range, check_fields, fields_of
from tests.resolve import resolve_settings

from .test_methods import NEEDS_CLIP

# String fields have no generic "other" value; these are valid non-defaults.
STRING_VALUES = {"ctx_init": "a photo of a", "weights": "clip.pt", "device": "cuda", "dataset": "cifar10",
                 "data_root": "/data"}


def other_value(name: str, typ, default):
    """A valid value different from ``default``, as the text ``--set`` would carry, and as parsed."""
    rng = None
    if typing.get_origin(typ) is Annotated:
        typ, rng = typing.get_args(typ)[0], next(a for a in typing.get_args(typ)[1:] if isinstance(a, Range))
    if typing.get_origin(typ) is Literal:
        v = next(a for a in typing.get_args(typ) if a != default)
        return str(v), v
    if typ is bool:
        return str(not default), not default
    if typ is str:
        return STRING_VALUES[name], STRING_VALUES[name]
    if typ is int:
        v = default + 1 if rng is None or rng.contains(default + 1) else default - 1
        return str(v), v
    if typ is float:
        v = default * 2 if default else 0.5
        if rng is not None and not rng.contains(v):
            v = (default + rng.hi) / 2 if rng.hi is not None else default / 2
        return repr(v), v
    raise AssertionError(f"no test value for {name}: {typ}")


def method_cases():
    for m in METHODS.names():
        cls = METHODS.get(m)
        for f in dataclasses.fields(cls.Params):
            yield pytest.param(m, f.name, id=f"{m}.{f.name}")


# A field the defaults do not use (Params.ignored()) is set together with what makes it used.
ENABLERS = {"noise_scale": {"noise": "laplace"}, "perturb": {"noise": "laplace"}, "predict_with": {"noise": "laplace"},
            "shots": {"anchors": "prototypes"}, "pad": {"visual": "pixel"}, "dataset": {"visual": "pixel"},
            "data_root": {"visual": "pixel"}}


def enablers(cls, field: str) -> dict[str, str]:
    if field not in getattr(cls.Params(), "ignored", dict)():
        return {}
    assert field in ENABLERS, f"add to ENABLERS what makes {cls.name}'s {field} used"
    return ENABLERS[field]


@pytest.mark.parametrize("method,field", list(method_cases()))
def test_every_method_setting_arrives(method, field, skewed):
    cls = METHODS.get(method)
    typ = fields_of(cls.Params)[field]
    text, value = other_value(field, typ, getattr(cls.Params(), field))
    extra = enablers(cls, field)
    for key in (f"method.{field}", field):  # qualified always; short when no other owner has the name
        if key == field and field in fields_of(OptimConfig):
            continue
        r = resolve_settings(method, [f"{key}={text}", *(f"method.{k}={v}" for k, v in extra.items())])
        assert getattr(r.params, field) == value
        assert {k: v for k, v in dataclasses.asdict(r.params).items() if k != field and k not in extra} == \
            {k: v for k, v in dataclasses.asdict(cls.Params()).items() if k != field and k not in extra}
    if method in NEEDS_CLIP or {field, *extra} & {"device", "weights", "anchors"}:
        return  # building these needs a CLIP tower, a GPU or labelled anchors: resolution is checked above
    ctx = MethodContext(skewed, r.head, r.optim)
    assert getattr(cls(ctx, r.params).p, field) == value


OPTIM_CASES = {
    "sgd": ["optim.optimizer=sgd", "optim.lr=0.05", "optim.momentum=0.5", "optim.weight_decay=0.001"],
    "adam": ["optim.optimizer=adam", "optim.lr=0.05", "optim.betas=0.8,0.99", "optim.eps=1e-06", "optim.weight_decay=0.001"],
}


@pytest.mark.parametrize("method", [m for m in METHODS.names() if METHODS.get(m).uses_optimizer])
@pytest.mark.parametrize("kind", list(OPTIM_CASES))
def test_every_optimizer_setting_arrives(method, kind, skewed):
    r = resolve_settings(method, OPTIM_CASES[kind])
    expected = {"optimizer": kind, "lr": 0.05, "weight_decay": 0.001,
                **({"momentum": 0.5} if kind == "sgd" else {"betas": (0.8, 0.99), "eps": 1e-6})}
    assert {k: getattr(r.optim, k) for k in expected} == expected
    if method not in NEEDS_CLIP:
        cls = METHODS.get(method)
        assert cls(MethodContext(skewed, r.head, r.optim), r.params).ctx.optim == r.optim


def test_a_key_two_owners_share_is_refused_naming_both_spellings():
    with pytest.raises(ConfigError) as e:
        resolve_settings("flesd", ["momentum=0.99"])
    assert "method.momentum" in str(e.value) and "optim.momentum" in str(e.value)
    assert resolve_settings("flesd", ["method.momentum=0.99"]).params.momentum == 0.99
    assert resolve_settings("flesd", ["params.momentum=0.99"]).params.momentum == 0.99


def test_unused_optimizer_settings_are_refused():
    with pytest.raises(ConfigError, match="Adam has no momentum"):
        resolve_settings("fedavg", ["momentum=0.5"])  # the fedavg default preset is Adam
    with pytest.raises(ConfigError, match="Adam setting"):
        resolve_settings("fedavg", ["optimizer=sgd", "eps=1e-6"])
    with pytest.raises(ConfigError, match="trains nothing"):
        resolve_settings("clip-zs", ["lr=0.1"])


def unused_cases():
    for m in METHODS.names():
        params = METHODS.get(m).Params()
        for field in getattr(params, "ignored", dict)():
            yield pytest.param(m, field, id=f"{m}.{field}")


@pytest.mark.parametrize("method,field", list(unused_cases()))
def test_a_method_setting_the_defaults_do_not_use_is_refused_with_the_reason(method, field):
    cls = METHODS.get(method)
    text, _ = other_value(field, fields_of(cls.Params)[field], getattr(cls.Params(), field))
    with pytest.raises(ConfigError, match=rf"{method} does not use method\.{field} \(.+\)"):
        resolve_settings(method, [f"method.{field}={text}"])


@pytest.mark.parametrize("method,unused,message,used", [
    ("fedpcl", ["noise_scale=0.1"], "noise=none sends the clean", ["noise=gaussian", "noise_scale=0.1"]),
    ("fedpcl", ["perturb=0.3"], "noise=none", ["noise=laplace", "perturb=0.3"]),
    ("fedpcl", ["noise=laplace", "predict=global", "predict_with=clean"], "predict=global does not classify",
     ["noise=laplace", "predict_with=clean"]),
    ("fedpcl", ["loss=supcon", "contrast=batch"], "loss=supcon contrasts", ["contrast=batch"]),
    ("fedpcl", ["loss=supcon", "prototypes=global"], "loss=supcon contrasts", ["prototypes=global"]),
    ("fedpcl", ["loss=supcon", "aggregation=mean"], "predict=local does not use the global",
     ["loss=supcon", "predict=global", "aggregation=mean"]),
    ("fedpcl", ["prototypes=global", "local_reduce=mean"], "sum and mean are the same", ["local_reduce=mean"]),
    ("fst-cbdg", ["losses=ist", "sigma=0.1"], "losses=ist draws no synthetic", ["losses=tsamp", "sigma=0.1"]),
    ("fst-cbdg", ["shots=8"], "anchors=text builds", ["anchors=prototypes", "shots=8"]),
    ("fst-cbdg", ["anchors=prototypes", "templates=ensemble"], "not from text templates", ["templates=ensemble"]),
    ("tpfl", ["pad=20"], "visual=feature prompts", ["visual=pixel", "pad=20"]),
    ("atpfl", ["data_root=/data"], "reads no images", ["visual=pixel", "data_root=/data"]),
])
def test_a_method_setting_the_configuration_does_not_use_is_refused(method, unused, message, used):
    with pytest.raises(ConfigError, match=message):
        resolve_settings(method, unused)
    resolve_settings(method, used)  # the same value where something reads it


@pytest.mark.parametrize("setting,message", [
    ("lr=nan", "finite"), ("lr=inf", "finite"), ("lr=-1", "> 0"), ("lr=0", "> 0"), ("eps=-1", "> 0"),
    ("momentum=1", r"\[0, 1\)"), ("betas=0.9", "2 comma-separated"), ("weight_decay=-0.1", ">= 0"),
])
def test_optimizer_values_out_of_range_are_refused(setting, message):
    method_and_sgd = ["optimizer=sgd"] if setting.startswith("momentum") else []
    with pytest.raises(ConfigError, match=message):
        resolve_settings("fedavg", [*method_and_sgd, setting])


def test_a_key_given_twice_is_refused():
    with pytest.raises(ConfigError, match="twice"):
        resolve_settings("fedprox", ["mu=0.1", "method.mu=0.2"])
    with pytest.raises(ConfigError, match="unknown prefix"):
        resolve_settings("fedprox", ["server.mu=0.1"])
    with pytest.raises(ConfigError, match="unknown --set"):
        resolve_settings("fedprox", ["optim.mu=0.1"])


def test_instances_built_in_python_are_range_checked():
    with pytest.raises(ConfigError, match="lr"):
        OptimConfig("sgd", float("nan"))
    with pytest.raises(ConfigError, match="finite"):
        check_fields(METHODS.get("fedprox").Params(mu=float("inf")))

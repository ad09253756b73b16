"""The validator at the bottom layer (fedcache/config.py): every number a user can set declares its valid range in
its type, and a value outside it is refused before any work starts, naming the setting and the range
(--image-size 0, --set tau=0, ...), whether it comes from the command line, --set or Python."""
import dataclasses
import math
import types
import typing
from typing import Annotated

import pytest

from fedcache.errors import ConfigError
from fedcache.extract.datasets import DatasetOptions
from fedcache.extract.runner import ExtractConfig
from fedcache.federate.methods import METHODS
from fedcache.federate.optim_config import OptimConfig
from fedcache.config import Range, check_fields, fields_of
from tests.resolve import resolve_settings
from fedcache.flower.config import Deployment
from fedcache.spec import SECTIONS


def _settable() -> dict[str, type]:
    classes = {f"{name}.Settings": cls.Settings for name, cls in METHODS.items()}
    classes.update({"OptimConfig": OptimConfig, "ExtractConfig": ExtractConfig, "DatasetOptions": DatasetOptions,
                    "flower Deployment": Deployment})
    classes.update({f"spec {name}": cls for name, cls in SECTIONS.items()})
    return classes


def _numbers(typ) -> list:
    """The int/float types inside ``typ`` (through Optional and tuples), each as declared."""
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin is Annotated:
        return [typ] if args[0] in (int, float) else []
    if origin in (typing.Union, types.UnionType, tuple):
        return [t for a in args if a is not Ellipsis for t in _numbers(a)]
    return [typ] if typ in (int, float) else []


def _range(typ) -> Range | None:
    if typing.get_origin(typ) is not Annotated:
        return None
    return next((a for a in typing.get_args(typ)[1:] if isinstance(a, Range)), None)


def test_every_number_a_user_sets_declares_its_range():
    missing = [f"{owner}.{name}" for owner, cls in _settable().items() for name, typ in fields_of(cls).items()
               if any(_range(t) is None for t in _numbers(typ))]
    assert not missing, f"give these a range type (fedcache/federate/settings.py): {missing}"


def _outside(rng: Range, base: type) -> list[str]:
    """Texts just outside ``rng`` (and a non-finite one for floats)."""
    bad = [] if base is int else ["nan", "inf"]
    if rng.lo is not None:
        bad.append(str(rng.lo if rng.lo_open else (rng.lo - 1 if base is int else rng.lo - 0.5)))
    if rng.hi is not None:
        bad.append(str(rng.hi if rng.hi_open else (rng.hi + 1 if base is int else rng.hi + 0.5)))
    return bad


def _method_cases() -> list:
    cases = []
    for name, cls in METHODS.items():
        for field, typ in fields_of(cls.Settings).items():
            nums = _numbers(typ)
            if len(nums) == 1 and typing.get_origin(typ) is not tuple and _range(nums[0]):  # others fail above
                base = typing.get_args(nums[0])[0]
                cases += [(name, field, text) for text in _outside(_range(nums[0]), base)]
    return cases


@pytest.mark.parametrize("method,field,text", _method_cases())
def test_a_method_setting_outside_its_range_is_refused_naming_it(method, field, text):
    with pytest.raises(ConfigError, match=rf"--set method\.{field}={text}: must be"):  # named as typed
        resolve_settings(method, [f"method.{field}={text}"])
    if field in {f.name for f in dataclasses.fields(OptimConfig)}:
        return  # its short name is ambiguous (flesd's momentum): said so instead
    with pytest.raises(ConfigError, match=rf"--set {field}={text}: must be"):
        resolve_settings(method, [f"{field}={text}"])


def test_a_method_setting_given_in_python_is_checked_too():
    with pytest.raises(ConfigError, match=r"tau=0.0: must be > 0"):
        METHODS.get("fedntd").Settings(tau=0.0)


@pytest.mark.parametrize("bad", [(0.9, 1.0), (0.9, math.nan), (-0.1, 0.9)])
def test_adam_betas_are_each_in_zero_one(bad):
    with pytest.raises(ConfigError, match="betas="):
        OptimConfig(betas=bad)


def _option_cases() -> list:
    """(flag, text) for every run option with a numeric range: texts just outside it, and nan/inf for floats."""
    from fedcache.spec import options

    cases = []
    for o in options():
        nums = _numbers(o.type)
        if len(nums) == 1 and _range(nums[0]):
            cases += [(o.flag, text) for text in _outside(_range(nums[0]), typing.get_args(nums[0])[0])]
    return cases


@pytest.mark.parametrize("flag,text", _option_cases())
def test_a_run_option_outside_its_range_is_refused_before_any_work(flag, text, tmp_path, capsys):
    # issue 18: --local-epochs 0/-1, --alpha inf, --batch-size -4 ... (generated, so a new option is covered)
    from fedcache.cli import main

    code = main(["train", "--store", str(tmp_path / "missing.zarr"), "-d", "x", "-b", "y", "-m", "fedavg", flag, text])
    err = capsys.readouterr().err
    assert code == 2 and f"{flag} (" in err and "no feature store" not in err, err


def _optim_cases() -> list:
    cases = []
    for field, typ in fields_of(OptimConfig).items():
        nums = _numbers(typ)
        if len(nums) == 1 and typing.get_origin(typ) is not tuple and _range(nums[0]):
            cases += [(field, text) for text in _outside(_range(nums[0]), typing.get_args(nums[0])[0])]
    return cases


@pytest.mark.parametrize("field,text", _optim_cases())
def test_an_optimizer_setting_outside_its_range_is_refused_naming_it(field, text):
    # issue 18: --set lr=nan, eps=-1 (every optimizer field, so a new one is covered)
    with pytest.raises(ConfigError, match=rf"--set optim\.{field}={text}: must be"):  # named as typed
        resolve_settings("fedavg", [f"optim.{field}={text}"])


@pytest.mark.parametrize("setting,message", [
    ("lr=nan", "finite"), ("lr=inf", "finite"), ("lr=-1", "> 0"), ("lr=0", "> 0"), ("eps=-1", "> 0"),
    ("momentum=1", r"\[0, 1\)"), ("betas=0.9", "2 comma-separated"), ("weight_decay=-0.1", ">= 0"),
])
def test_optimizer_values_out_of_range_are_refused(setting, message):
    method_and_sgd = ["optimizer=sgd"] if setting.startswith("momentum") else []
    with pytest.raises(ConfigError, match=message):
        resolve_settings("fedavg", [*method_and_sgd, setting])


def test_instances_built_in_python_are_range_checked():
    with pytest.raises(ConfigError, match="lr"):
        OptimConfig("sgd", float("nan"))
    with pytest.raises(ConfigError, match="finite"):
        check_fields(METHODS.get("fedprox").Settings(mu=float("inf")))


def test_a_redirected_value_is_refused_with_its_own_message_and_not_listed_as_accepted():
    from typing import Literal

    from fedcache.config import Redirect, allowed, parse

    typ = Annotated[Literal["a", "b"], Redirect((("c", "c is method d: run -m d"),))]
    assert allowed(typ) == "one of a, b"
    assert parse("x", "b", typ) == "b"
    with pytest.raises(ConfigError, match="^x=c: c is method d: run -m d$"):
        parse("x", "c", typ, verbatim=True)
    with pytest.raises(ConfigError, match="must be one of a, b"):
        parse("x", "e", typ)


def test_a_typo_of_a_choice_names_the_close_one():
    """`--partition dirichlett` said what the choices are, not which one was meant (a method's typo did)."""
    from fedcache.spec import RunSpec

    with pytest.raises(ConfigError, match=r"must be one of .*shards \(did you mean 'dirichlet'\?\)$"):
        RunSpec.of(dataset="d", backbones="b", method="fedavg", partition="dirichlett")
    with pytest.raises(ConfigError, match=r"\(did you mean 'dirichlet'\?\)$"):  # another case is no typo's distance
        RunSpec.of(dataset="d", backbones="b", method="fedavg", partition="DIRICHLET")
    with pytest.raises(ConfigError) as far:
        RunSpec.of(dataset="d", backbones="b", method="fedavg", partition="zzz")
    assert "did you mean" not in str(far.value)

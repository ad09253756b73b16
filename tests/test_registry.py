import pytest

from fedcache.errors import ConfigError, FedcacheError, UnknownNameError
from fedcache.registry import Registry


def test_register_get_and_list():
    reg: Registry[int] = Registry("widget")
    reg.add("alpha-one", 1)

    @reg.register("beta")
    def beta():
        return 2

    assert reg.get("alpha-one") == 1 and reg.get("beta") is beta
    assert reg.names() == ["alpha-one", "beta"] and len(reg) == 2 and "beta" in reg


def test_duplicate_and_non_kebab_names_are_errors():
    reg: Registry[int] = Registry("widget")
    reg.add("alpha", 1)
    with pytest.raises(ConfigError, match="duplicate widget name 'alpha'"):
        reg.add("alpha", 2)
    for bad in ("Alpha", "alpha_beta", "alpha-", "-a", "a b"):
        with pytest.raises(ConfigError, match="kebab-case"):
            reg.add(bad, 3)


def test_unknown_name_suggests_close_matches_and_lists_all():
    reg: Registry[int] = Registry("backbone")
    for n in ("clip-rn50", "clip-rn101", "resnet18-imagenet"):
        reg.add(n, 0)
    with pytest.raises(UnknownNameError) as info:
        reg.get("clip-rn5")
    msg = str(info.value)
    assert "unknown backbone 'clip-rn5'" in msg and "Did you mean 'clip-rn50'" in msg
    with pytest.raises(UnknownNameError, match=r"Did you mean 'clip-rn50'"):  # named in another case
        reg.get("CLIP-RN50")
    assert "Known: clip-rn101, clip-rn50, resnet18-imagenet" in msg
    # It is both a FedcacheError (CLI) and a KeyError (library users).
    assert isinstance(info.value, FedcacheError) and isinstance(info.value, KeyError)


def test_prefix_factories():
    reg: Registry[str] = Registry("backbone")
    reg.add_prefix("timm", lambda rest: f"built {rest}", "timm:<model>")
    assert reg.get("timm:resnet18") == "built resnet18"
    with pytest.raises(ConfigError, match="needs a value after 'timm:'"):
        reg.get("timm:")
    with pytest.raises(UnknownNameError, match=r"Also accepted: timm:<model>"):
        reg.get("nope")


def test_a_declared_name_is_known_before_its_module_is_imported(tmp_path, monkeypatch):
    """METHODS declares each method by its file: the name is listed, matched and checked with nothing imported (a
    method's module imports torch), and ``get`` imports the module, whose registration gives the item."""
    import sys
    import types

    reg: Registry[int] = Registry("widget")
    monkeypatch.setitem(sys.modules, "widget_owner", types.SimpleNamespace(REG=reg))
    (tmp_path / "widget_one.py").write_text("import widget_owner\nwidget_owner.REG.add('widget-one', 1)\n")
    (tmp_path / "widget_two.py").write_text("import widget_owner\nwidget_owner.REG.add('widget-deux', 2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg.declare("widget-one", "widget_one")
    reg.add("widget-zero", 0)
    assert reg.names() == ["widget-one", "widget-zero"] and "widget-one" in reg and len(reg) == 2
    reg.check("widget-one")
    with pytest.raises(UnknownNameError, match=r"Did you mean 'widget-one'.* Known: widget-one, widget-zero\."):
        reg.check("widget-onr")
    assert "widget_one" not in sys.modules
    assert reg.get("widget-one") == 1 and "widget_one" in sys.modules
    reg.declare("widget-two", "widget_two")  # its module registers another name: said, not a KeyError later
    with pytest.raises(ConfigError, match="importing widget_two registered no widget 'widget-two'"):
        dict(reg.items())
    with pytest.raises(ConfigError, match="duplicate widget name 'widget-one'"):
        reg.declare("widget-one", "widget_one")
    monkeypatch.delitem(sys.modules, "widget_one")
    monkeypatch.delitem(sys.modules, "widget_two")


def test_a_declared_name_is_refused_to_another_module_before_its_own_is_imported(tmp_path, monkeypatch):
    """A script's ``@METHODS.register("fedavg")`` before the built-in is loaded: accepted, it stood in for the
    built-in, whose own registration then failed a later, unrelated ``get`` as a duplicate."""
    import sys
    import types

    reg: Registry[int] = Registry("widget")
    monkeypatch.setitem(sys.modules, "widget_owner", types.SimpleNamespace(REG=reg))
    (tmp_path / "widget_six.py").write_text("import widget_owner\nwidget_owner.REG.add('widget-six', 6)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg.declare("widget-six", "widget_six")
    with pytest.raises(ConfigError, match=r"widget name 'widget-six' is a built-in widget's \(registered by "
                                          r"widget_six\); register yours under another name"):
        reg.add("widget-six", 7)
    assert reg.get("widget-six") == 6  # its own module, registering while it is imported, is accepted
    with pytest.raises(ConfigError, match="duplicate widget name 'widget-six'"):
        reg.add("widget-six", 7)
    monkeypatch.delitem(sys.modules, "widget_six")


def test_a_declared_module_registering_an_undeclared_name_too_is_refused(tmp_path, monkeypatch):
    """Else the extra name is listed only once its module is loaded: names() and len() follow what was asked first."""
    import sys
    import types

    reg: Registry[int] = Registry("widget")
    monkeypatch.setitem(sys.modules, "widget_owner", types.SimpleNamespace(REG=reg))
    (tmp_path / "widget_pair.py").write_text("import widget_owner\nwidget_owner.REG.add('widget-pair', 2)\n"
                                             "widget_owner.REG.add('widget-extra', 3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg.declare("widget-pair", "widget_pair")
    with pytest.raises(ConfigError, match=r"importing widget_pair registered widget 'widget-extra' beside "
                                          r"'widget-pair', the name it is declared with: move it to a module of its "
                                          r"own, and declare each name with the module that registers it$"):
        reg.get("widget-pair")
    monkeypatch.delitem(sys.modules, "widget_pair")

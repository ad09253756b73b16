"""Datasets, backbones and the extraction runner.

The package is also callable: ``fedcache.extract(dataset, backbones, store=...)`` is the Python API's
extract (fedcache/api.py). Python sets ``fedcache.extract`` to this package as soon as any of its
submodules is imported, so a plain function of that name would be shadowed; a callable module is not.
"""
import sys as _sys
import types as _types


class _CallableModule(_types.ModuleType):
    def __call__(self, *args, **kwargs):
        from fedcache.api import extract

        return extract(*args, **kwargs)


_sys.modules[__name__].__class__ = _CallableModule

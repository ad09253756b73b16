"""The `fedcache` command line: a thin layer over the library that draws tables and progress bars.

A package of small modules (docs/architecture.md): common.py (consoles, options generated from
fedcache/spec.py and fedcache/extract/config.py, progress), one module per group of commands (extract, store,
train, grid, methods) and root.py (the app, the order of its commands, the entry point). The names below are what
callers and tests use; they are re-exported here so that ``from fedcache.cli import ...`` does not depend on that
layout.
"""
from fedcache.cli.common import DEFAULT_STORE, ExtractProgress, HELP_FLAGS, StoreOpt, _csv, _progress, _spec_params, console, err
from fedcache.cli.grid import GRID_HOW, GRID_OWN, GRID_SKIPS
from fedcache.cli.methods import _method_command, _method_commands
from fedcache.cli.root import EXAMPLES, INTERRUPTED, _console_script, app, main
from fedcache.cli.store import store_app
from fedcache.cli.train import ENGINES, PARTITION_OPTIONS, _result_line

__all__ = [
    "DEFAULT_STORE", "ENGINES", "EXAMPLES", "ExtractProgress", "GRID_HOW", "GRID_OWN", "GRID_SKIPS", "HELP_FLAGS",
    "INTERRUPTED", "PARTITION_OPTIONS", "StoreOpt", "_console_script", "_csv", "_method_command", "_method_commands",
    "_progress", "_result_line", "_spec_params", "app", "console", "err", "main", "store_app",
]

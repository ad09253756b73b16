"""The `fedcache` console script's entry point (pyproject.toml's ``[project.scripts]``), light on purpose.

The script pip writes imports this module at its top, and so does every worker of ``fedcache grid --jobs N``:
a spawned process re-runs its parent's main script (without calling ``main``) before it takes any work. The CLI
(typer, rich, every command's module: half a second) is imported in ``main``, by the command alone; a worker
that imported it too spent that half second longer without its SIGTERM handler (fedcache/workers.py)."""


def main() -> None:
    from fedcache.cli.root import _console_script

    _console_script()

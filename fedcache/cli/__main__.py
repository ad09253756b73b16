"""`python -m fedcache.cli`: the `fedcache` console script."""
from fedcache.cli.root import _console_script

if __name__ == "__main__":
    _console_script()

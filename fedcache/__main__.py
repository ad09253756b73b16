"""`python -m fedcache`: the `fedcache` command, where the console script is not on PATH (a venv not activated).

Light as _console.py is: a grid worker spawned from this process re-imports it (as ``__mp_main__``) before work."""
from fedcache._console import main

if __name__ == "__main__":
    main()

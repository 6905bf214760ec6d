"""zt probe's Python bootstrap (zt probe puts this directory first on PYTHONPATH).

It installs the zerotrace hooks (python/zerotrace/hooks/: the uncaught exception, the
communicator's world size, the HF Trainer's and Lightning's epochs and steps), then imports the
`sitecustomize` the program would have imported without zt probe (the next one on sys.path,
e.g. Debian's /usr/lib/python3.X/sitecustomize.py), exactly as Python's site module would: its
errors are reported as site reports them. This directory leaves sys.path again; the directory
of the zerotrace package stays, so the program can `import zerotrace`.
"""


def _zerotrace_bootstrap():
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from zerotrace import hooks

        hooks.install()
    except Exception as err:  # the program runs on, unhooked
        if os.environ.get("ZT_PROBE_PYTHON_DEBUG"):
            sys.stderr.write("zt probe (python bootstrap): %s: %s\n" % (type(err).__name__, err))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    ours = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401  the program's own, if it has one
    except ImportError as err:
        if err.name != "sitecustomize":
            raise
        sys.modules["sitecustomize"] = ours  # none: this module stands in (the import must find one)


_zerotrace_bootstrap()
del _zerotrace_bootstrap

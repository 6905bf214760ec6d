"""zt probe's Python bootstrap hooks: one module per thing hooked, each with an `install()`.

zt probe puts a `sitecustomize` on the program's PYTHONPATH (python/zt_bootstrap/) that calls
install() below and then chains to the sitecustomize the program would have had. install()
imports every module of this package whose name does not start with "_" and calls its
`install()`; a hook that fails is skipped (ZT_PROBE_PYTHON_DEBUG=1 prints why), the program
runs on. To hook something new, add a module here (nothing else to edit):

    from . import _imports
    def install():
        _imports.when_imported("some.module", patch)  # runs patch(module) once it is imported

The rules every hook keeps: never change what the program computes or prints; import nothing
heavy at start-up (wait for the program to import the framework: _imports.when_imported); do
nothing where the probe is not loaded (zerotrace._probe's functions return at once then).

Helpers for hooks: _imports.when_imported, _wrap.wrap_init (a framework class's __init__, wrapped
once), _ranges.EpochsAndSteps (the ranges a callback keeps open).

Hooks here: exceptions (an uncaught exception -> the trace's error row), distributed
(torch.distributed's world size), transformers_trainer and lightning (epochs and steps from
the HF Trainer's and PyTorch Lightning's callbacks), torch_optimizer (a plain PyTorch loop's steps:
its optimizer's step() calls), torch_memory (PyTorch's allocator history: tensors as block rows,
added by zt probe).
"""

import importlib
import os
import pkgutil
import sys


def debug(what, err):
    if os.environ.get("ZT_PROBE_PYTHON_DEBUG"):
        sys.stderr.write("zt probe (python bootstrap): %s: %s: %s\n" % (what, type(err).__name__, err))


def install():
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        try:
            importlib.import_module(__name__ + "." + info.name).install()
        except Exception as err:  # a hook never stops the program
            debug("hook " + info.name, err)

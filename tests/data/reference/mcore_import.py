"""Imports megatron-core's dataset code without running megatron/core/__init__.py.

megatron-core 0.16's package __init__ imports its distributed/optimizer modules, which need
torch >= 2.x APIs; Debian's torch 1.13 (all this machine has) lacks them. The dataset modules
themselves only need numpy, torch.utils.data and the compiled helpers_cpp extension, so we register
`megatron` and `megatron.core` as plain namespace modules pointing at the installed package and
import the submodules we need from it, unmodified. parallel_state is imported first to settle the
circular import utils <-> parallel_state that the package __init__ normally orders for us.

BlendedDataset calls torch.distributed.get_rank() on a cache miss even when torch.distributed is
not initialized (it would raise); we answer 0, as a single-process run is rank 0.
"""
import importlib.util
import os
import sys
import types


def load_megatron_core():
    if "megatron.core" in sys.modules:
        return  # already loaded (by this function or by a real import)
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("megatron-core is not installed for " + sys.executable +
                 "; run scripts/install-python-deps")
    root = list(spec.submodule_search_locations)[0]
    for name, path in (("megatron", root), ("megatron.core", os.path.join(root, "core"))):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [path]
            sys.modules[name] = module
    import megatron.core.parallel_state  # noqa: F401  (settles the circular import)
    import torch.distributed
    if not torch.distributed.is_initialized():
        torch.distributed.get_rank = lambda *args, **kwargs: 0

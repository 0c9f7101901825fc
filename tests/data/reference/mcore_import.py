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


STEP_WHEEL = "megatron_core-0.19.2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"


def load_step_calculator():
    """megatron-core 0.19.2's megatron/core/num_microbatches_calculator.py, unmodified.

    --step-batch-size-schedule (StepBatchsizeNumMicroBatchesCalculator) arrived in megatron-core
    0.18; the venv's 0.16.1 predates it, and 0.18+ wheels need Python >= 3.12 (Debian has 3.11).
    scripts/install-python-deps downloads the pinned 0.19.2 wheel (sha256 checked) without
    installing it; this reads that one module (it imports only logging, abc and typing) out of
    the wheel and runs it under its own module name. $TRIDENT_MCORE_STEP_WHEEL overrides the path.
    """
    import zipfile
    path = os.environ.get("TRIDENT_MCORE_STEP_WHEEL",
                          os.path.join(sys.prefix, "wheels", STEP_WHEEL))
    if not os.path.isfile(path):
        sys.exit(path + " not found: run scripts/install-python-deps (it downloads megatron-core "
                 "0.19.2 for the --step-batch-size-schedule reference)")
    with zipfile.ZipFile(path) as z:
        source = z.read("megatron/core/num_microbatches_calculator.py")
    module = types.ModuleType("mcore_0_19_num_microbatches_calculator")
    module.__file__ = path + "/megatron/core/num_microbatches_calculator.py"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module

"""The torch floor pyproject declares is the newest release that has every torch API the library uses: each `from
torch... import` and `import torch...` of the library (and the newer attributes it reads) is tabled with the first
release that has it, every table entry is used and exists in the installed torch, and README states the same range."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path

from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
LIBRARY = ("common", "kernels", "calibration", "trainable", "sweeps")

# torch API -> the first torch release that has it (from the release notes; where they are silent, a release known
# to have it). A library import missing here fails the test: add it with its release.
TORCH_APIS = {
    "torch": "2.0", "torch.nn": "2.0", "torch.nn.functional": "2.0", "torch.distributed": "2.0",
    "torch.distributed.checkpoint": "2.0", "torch.utils.checkpoint.checkpoint": "2.0",
    "torch._dynamo.utils.counters": "2.0", "torch._dynamo.utils.compile_times": "2.0",
    "torch._inductor.config": "2.0", "torch._functorch.config": "2.0",
    "torch.distributed.device_mesh.init_device_mesh": "2.2", "torch.distributed.device_mesh.DeviceMesh": "2.2",
    "torch.overrides.TorchFunctionMode": "2.0", "torch.nn.attention.SDPBackend": "2.3", "torch.nn.attention.sdpa_kernel": "2.3",
    "torch.nn.attention._cur_sdpa_kernel_backends": "2.3",  # private: what sdpa_kernel itself saves on entering
    "torch.distributed.checkpoint.state_dict.get_model_state_dict": "2.3",
    "torch.distributed.checkpoint.state_dict.get_optimizer_state_dict": "2.3",
    "torch.distributed.checkpoint.state_dict.set_model_state_dict": "2.3",
    "torch.distributed.checkpoint.state_dict.set_optimizer_state_dict": "2.3",
    "torch.distributed.checkpoint.state_dict.StateDictOptions": "2.3",
    "torch._functorch.config.enable_autograd_cache": "2.5",
    "torch.distributed.tensor.DTensor": "2.5",  # public torch.distributed.tensor (was torch.distributed._tensor)
    "torch.OutOfMemoryError": "2.5",  # was torch.cuda.OutOfMemoryError
    "torch._inductor.runtime.cache_dir_utils.default_cache_dir": "2.6",
    "torch.distributed.fsdp.fully_shard": "2.6",  # FSDP2 public (was torch.distributed._composable.fsdp)
    "torch.distributed.fsdp.FSDPModule": "2.6",
    "torch.distributed.fsdp.MixedPrecisionPolicy": "2.6",
    "torch._dynamo.eval_frame._debug_get_cache_entry_list": "2.1",  # private: Dynamo's graphs of a code object
    "torch._dynamo.config.recompile_limit": "2.7",  # was cache_size_limit (renamed after 2.6 branched)
}


def torch_uses(root: Path = REPO) -> tuple[set[str], set[str]]:
    """(every torch import of the library as a dotted name, every dotted torch.* attribute chain it reads)."""
    imports, chains = set(), set()
    for layer in LIBRARY:
        for path in sorted((root / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    imports |= {alias.name for alias in node.names if alias.name.split(".")[0] == "torch"}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] \
                        == "torch":
                    imports |= {f"{node.module}.{alias.name}" for alias in node.names}
                elif isinstance(node, ast.Attribute):
                    parts, value = [node.attr], node.value
                    while isinstance(value, ast.Attribute):
                        parts.append(value.attr)
                        value = value.value
                    if isinstance(value, ast.Name) and value.id == "torch":
                        chains.add(".".join(["torch", *reversed(parts)]))
    return imports, chains


def _declared_floor() -> str:
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (torch,) = [d for d in dependencies if re.match(r"torch\s*[<>=!~]", d)]
    return re.search(r">=\s*([\d.]+)", torch).group(1)


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_torch_import_of_the_library_is_tabled_with_its_release():
    imports, _ = torch_uses()
    assert sorted(imports - set(TORCH_APIS)) == []


def test_every_tabled_api_is_used_and_exists_in_the_installed_torch():
    imports, chains = torch_uses()
    assert sorted(api for api in TORCH_APIS if api not in imports | chains) == []
    assert sorted(api for api in TORCH_APIS if not _resolves(api)) == []


def test_pyproject_and_readme_declare_the_newest_release_the_apis_need():
    floor = _declared_floor()
    assert Version(floor) == max(Version(v) for v in TORCH_APIS.values()), (floor, TORCH_APIS)
    assert f"{floor} <= torch < 3" in " ".join((REPO / "README.md").read_text().split())


def test_the_scan_sees_imports_and_attribute_chains_inside_functions(tmp_path):
    for layer in LIBRARY:
        (tmp_path / layer).mkdir()
    (tmp_path / "trainable" / "m.py").write_text("import torch\n\ndef f():\n    from torch.distributed.fsdp import "
                                                 "fully_shard\n    return torch._dynamo.config.recompile_limit\n")
    imports, chains = torch_uses(tmp_path)
    assert imports == {"torch", "torch.distributed.fsdp.fully_shard"}
    assert "torch._dynamo.config.recompile_limit" in chains and "torch._dynamo" in chains

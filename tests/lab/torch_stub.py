"""Light stand-ins for PyTorch and CUDA extension packages, installed into a test-bed container.

They carry what fleetfix's probe can observe without a GPU: import names, `torch.__version__`,
`torch.version.cuda`, `torch.cuda.is_available()` (False, as on a machine without a GPU),
`torch.utils.cpp_extension.CUDA_HOME` (found the way PyTorch finds it), and `*.dist-info` metadata so
`importlib.metadata` and `pip list` see the distributions. `causal_conv1d` imports its compiled
`causal_conv1d_cuda` extension at import time, like the real package, so "built" vs "not built" is the
difference between `import causal_conv1d` working and failing with ModuleNotFoundError.

Everything goes to Debian's /usr/bin/python3 (3.11) path `/usr/local/lib/python3.11/dist-packages` by
default; pass `site=` for a venv.

Where each imitated behaviour comes from (docs/testbed.md's stand-in table names the tests that hold them
to the real artifacts):
* torch/version.py's names: the real torch 2.14.1 wheel's version.py (`__all__ = ['__version__', 'debug',
  'cuda', 'git_version', 'hip', 'rocm', 'xpu']`; the test bed's real venv, tests/lab/realtorch.py).
* `torch.cuda.is_available()` False: what the real torch 2.14.1 returns on this GPU-less machine.
* `CUDA_HOME`: `_find_cuda_home()` of torch 2.14.1's torch/utils/cpp_extension.py (CUDA_HOME, then
  CUDA_PATH, then dirname(dirname(which nvcc)), then /usr/local/cuda if it exists; the "No CUDA runtime is
  found" warning, in torch's logging format, when torch.cuda is not available), evaluated only for a CUDA
  build, as line 364 there does.
* dist-info: pip's layout (PEP 376 RECORD with urlsafe-base64 SHA-256 digests, PEP 427 WHEEL).
* causal_conv1d: Dao-AILab/causal-conv1d's causal_conv1d/causal_conv1d_interface.py has a top-level
  `import causal_conv1d_cuda`, so importing the package fails without the compiled module.
* fla: flash-linear-attention is pure Python and imports torch; nothing else of it is imitated.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from tests.lab.container import Container

DEFAULT_SITE = "/usr/local/lib/python3.11/dist-packages"
# The container's python is Debian's 3.11: its extension suffix, not necessarily pytest's.
EXTENSION_SUFFIX = ".cpython-311-x86_64-linux-gnu.so"

_TORCH_INIT = '''"""Test-bed stand-in for PyTorch: version and CUDA metadata only, no tensors."""
from torch import version as version
from torch import cuda as cuda
from torch import utils as utils

__version__ = version.__version__
'''

_TORCH_CUDA = '''"""No GPU in the test bed: CUDA is compiled in (per torch.version.cuda) but not available."""
from torch import version as _version


def is_available():
    return False


def device_count():
    return 0


def _is_compiled():
    return _version.cuda is not None


def get_arch_list():
    return []
'''

_CPP_EXTENSION = '''"""What a probe reads from torch.utils.cpp_extension: CUDA_HOME, found as PyTorch does."""
import datetime
import os
import shutil
import sys

import torch


def _find_cuda_home():
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if cuda_home is None:
        nvcc_path = shutil.which("nvcc")
        if nvcc_path is not None:
            cuda_home = os.path.dirname(os.path.dirname(nvcc_path))
        else:
            cuda_home = "/usr/local/cuda"
            if not os.path.exists(cuda_home):
                cuda_home = None
    if cuda_home and not torch.cuda.is_available():
        # torch's own logging format (glog-like: level, MMDD time, pid, file:line of the real call).
        now = datetime.datetime.now()
        print(f"W{now:%m%d %H:%M:%S.%f} {os.getpid()} torch/utils/cpp_extension.py:183] "
              f"No CUDA runtime is found, using CUDA_HOME='{cuda_home}'", file=sys.stderr)
    return cuda_home


CUDA_HOME = _find_cuda_home() if torch.cuda._is_compiled() else None
'''

_CAUSAL_CONV1D_EXT_C = r"""
#include <Python.h>
static PyObject *fwd(PyObject *self, PyObject *args) {
    PyErr_SetString(PyExc_RuntimeError, "CUDA error: no CUDA-capable device is detected");
    return NULL;
}
static PyMethodDef methods[] = {{"causal_conv1d_fwd", fwd, METH_VARARGS, "stub"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "causal_conv1d_cuda", "test-bed stub", -1, methods};
PyMODINIT_FUNC PyInit_causal_conv1d_cuda(void) { return PyModule_Create(&module); }
"""


def _record_line(relative: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{relative},sha256={digest},{len(data)}"


def install_distribution(
    ct: Container,
    dist_name: str,
    version: str,
    files: Mapping[str, bytes | str],
    *,
    site: str = DEFAULT_SITE,
    requires: tuple[str, ...] = (),
) -> None:
    """Write files (paths relative to site-packages) plus a pip-style dist-info into the container."""
    payload = {path: data.encode() if isinstance(data, str) else data for path, data in files.items()}
    dist_info = f"{dist_name.replace('-', '_')}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    top_level = sorted({path.split("/")[0].split(".")[0] for path in payload})
    payload[f"{dist_info}/METADATA"] = metadata.encode()
    payload[f"{dist_info}/INSTALLER"] = b"pip\n"
    payload[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: fleetfix-lab\nRoot-Is-Purelib: false\n"
    payload[f"{dist_info}/top_level.txt"] = ("\n".join(top_level) + "\n").encode()
    record = [_record_line(path, data) for path, data in payload.items()]
    record.append(f"{dist_info}/RECORD,,")
    payload[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    for relative, data in payload.items():
        mode = 0o755 if relative.endswith(".so") else 0o644
        ct.write_file(f"{site}/{relative}", data, mode)


def torch_files(version: str = "2.11.0+cu128", cuda: str | None = "12.8") -> dict[str, str]:
    """The stand-in torch package's files, relative to site-packages."""
    version_py = (
        f"__version__ = {version!r}\n"
        "debug = False\n"
        f"cuda = {cuda!r}\n"
        "git_version = '0123456789abcdef0123456789abcdef01234567'\n"
        "hip = None\n"
        "rocm = None\n"
        "xpu = None\n"
    )
    return {
        "torch/__init__.py": _TORCH_INIT,
        "torch/version.py": version_py,
        "torch/cuda/__init__.py": _TORCH_CUDA,
        "torch/utils/__init__.py": "",
        "torch/utils/cpp_extension.py": _CPP_EXTENSION,
    }


def install_torch(
    ct: Container,
    version: str = "2.11.0+cu128",
    cuda: str | None = "12.8",
    *,
    site: str = DEFAULT_SITE,
) -> None:
    """A torch whose `torch.version.cuda` is cuda (None = a CPU build)."""
    install_distribution(ct, "torch", version, torch_files(version, cuda), site=site)


def install_fla(
    ct: Container,
    version: str = "0.6.0",
    *,
    dist_name: str = "flash-linear-attention",
    site: str = DEFAULT_SITE,
) -> None:
    """flash-linear-attention (import name `fla`): pure Python, imports torch like the real one."""
    install_distribution(
        ct,
        dist_name,
        version,
        {
            "fla/__init__.py": f"import torch  # noqa: F401\n__version__ = {version!r}\n",
        },
        site=site,
        requires=("torch>=2.5",),
    )


def build_causal_conv1d_extension(cache_dir: Path) -> bytes:
    """Compile (once per cache dir) a tiny real extension module named causal_conv1d_cuda."""
    target = cache_dir / f"causal_conv1d_cuda{EXTENSION_SUFFIX}"
    if not target.exists():
        cache_dir.mkdir(parents=True, exist_ok=True)
        source = cache_dir / "causal_conv1d_cuda.c"
        source.write_text(_CAUSAL_CONV1D_EXT_C)
        include = "/usr/include/python3.11"
        if not Path(include, "Python.h").exists():  # fall back to the running interpreter's headers
            include = sysconfig.get_paths()["include"]
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-O0", f"-I{include}", "-o", str(target), str(source)],
            check=True,
            capture_output=True,
        )
    return target.read_bytes()


def install_causal_conv1d(
    ct: Container,
    version: str = "1.7.0",
    *,
    compiled: bool,
    cache_dir: Path,
    site: str = DEFAULT_SITE,
) -> None:
    """causal-conv1d; with compiled=False the extension is missing, as after a failed build."""
    files: dict[str, bytes | str] = {
        "causal_conv1d/__init__.py": (
            f"__version__ = {version!r}\n"
            "from causal_conv1d.causal_conv1d_interface import causal_conv1d_fn  # noqa: F401\n"
        ),
        "causal_conv1d/causal_conv1d_interface.py": (
            "import causal_conv1d_cuda\n\n\n"
            "def causal_conv1d_fn(*args, **kwargs):\n"
            "    return causal_conv1d_cuda.causal_conv1d_fwd(*args)\n"
        ),
    }
    if compiled:
        files[f"causal_conv1d_cuda{EXTENSION_SUFFIX}"] = build_causal_conv1d_extension(cache_dir)
    install_distribution(ct, "causal-conv1d", version, files, site=site, requires=("torch",))

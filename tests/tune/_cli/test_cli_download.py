"""`tune download REPO_ID [--output-dir] [--hf-token] [--ignore-patterns]` (tune/_cli/_download.py)."""

import json
import time
from types import SimpleNamespace

import huggingface_hub
import pytest
from huggingface_hub import errors


def test_offline_it_fails_within_seconds_with_a_clear_message(tune_subprocess, tmp_path):
    # this machine reaches no Hugging Face Hub: the real client must fail fast, and tune must say why
    start = time.monotonic()
    proc = tune_subprocess("download", "Qwen/Qwen2.5-0.5B-Instruct", "--output-dir", str(tmp_path / "m"), timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1
    assert "tune: error: could not download Qwen/Qwen2.5-0.5B-Instruct from the Hugging Face Hub" in proc.stderr
    assert "Check the network connection" in proc.stderr and "Traceback" not in proc.stderr
    assert elapsed < 20, f"took {elapsed:.1f} s"
    assert not (tmp_path / "m" / "tune_download.json").exists()


@pytest.fixture
def fake_hub(monkeypatch):
    """Stands in for the Hub service (unreachable here); records what tune asked of it."""
    calls = {}

    class Api:
        def __init__(self, token=None):
            calls["token"] = token

        def model_info(self, repo_id, revision=None, timeout=None):
            calls["info"] = (repo_id, revision, timeout)
            if repo_id == "gated/model":
                raise _Gated()
            return SimpleNamespace(sha="0123456789abcdef0123")

    def snapshot_download(repo_id, *, revision, local_dir, token, ignore_patterns, etag_timeout):
        calls["snapshot"] = (repo_id, revision, str(local_dir), token, ignore_patterns)
        if repo_id.startswith("stop/"):
            raise RuntimeError("stopped by the test")
        (local_dir / "sub").mkdir(parents=True, exist_ok=True)
        (local_dir / "config.json").write_text("{}")
        (local_dir / "sub" / "model.safetensors").write_text("x")
        return str(local_dir)

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


class _Gated(errors.GatedRepoError):
    def __init__(self):  # the real one wants an HTTP response
        Exception.__init__(self, "gated")


def test_downloads_the_resolved_commit_and_records_it(tune, fake_hub, tmp_path):
    out = tmp_path / "model"
    code, stdout, err = tune(
        "download",
        "org/model",
        "--output-dir",
        str(out),
        "--hf-token",
        "hf_x",
        "--ignore-patterns",
        "original/*",
        "--ignore-patterns",
        "*.pth",
    )
    assert code == 0, err
    assert fake_hub["info"] == ("org/model", None, 10.0)
    assert fake_hub["snapshot"] == ("org/model", "0123456789abcdef0123", str(out), "hf_x", ["original/*", "*.pth"])
    record = json.loads((out / "tune_download.json").read_text())
    assert {k: record[k] for k in ("repo_id", "revision", "requested_revision", "ignore_patterns")} == {
        "repo_id": "org/model",
        "revision": "0123456789abcdef0123",
        "requested_revision": "main",
        "ignore_patterns": ["original/*", "*.pth"],
    }
    assert stdout.splitlines() == [
        f"Downloaded org/model (0123456789ab) to {out}: 3 files",
        "  config.json",
        "  sub/model.safetensors",
        "  tune_download.json",
    ]


def test_default_output_dir_is_tmp_and_the_repo_name(tune, fake_hub):
    # the shipped configs read /tmp/<repo name>; the fake stops before writing anything there
    code, _, err = tune("download", "stop/Some-Model")
    assert fake_hub["snapshot"][2] == "/tmp/Some-Model"
    assert code == 1 and "RuntimeError: stopped by the test" in err


def test_a_gated_repo_says_how_to_get_access(tune, fake_hub, tmp_path):
    code, _, err = tune("download", "gated/model", "--output-dir", str(tmp_path))
    assert code == 1 and "gated/model is gated: accept its license at https://huggingface.co/gated/model" in err
    assert "--hf-token" in err

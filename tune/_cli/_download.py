"""``tune download REPO_ID``: fetches a model snapshot from the Hugging Face Hub and records what was fetched."""

import argparse
import datetime
import json
import os
import tempfile
from pathlib import Path

import tune
from tune._cli._common import HelpFormatter, examples
from tune.config import TuneError

RECORD_FILE = "tune_download.json"  # read by the PEFT adapter export for base_model_name_or_path
_TIMEOUT_S = 10.0  # per request: offline, fail in seconds rather than hang


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "download",
        help="download a model from the Hugging Face Hub",
        description=(
            "Download a model repository from the Hugging Face Hub (huggingface_hub.snapshot_download) and write\n"
            f"{RECORD_FILE} beside the files, recording the repo id and the exact commit (LoRA adapter exports\n"
            "name it as their base model). Gated models (Llama, Gemma) need their license accepted on the Hub\n"
            "and a token."
        ),
        formatter_class=HelpFormatter,
        epilog=examples(
            "tune download Qwen/Qwen2.5-0.5B-Instruct",
            "tune download meta-llama/Llama-3.2-1B-Instruct --output-dir /tmp/Llama-3.2-1B-Instruct \\",
            '    --ignore-patterns "original/consolidated.00.pth" --hf-token $HF_TOKEN',
        ),
    )
    parser.add_argument("repo_id", metavar="REPO_ID", help="the Hub repository; e.g. Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument(
        "--output-dir",
        type=Path,
        metavar="DIR",
        help="where to put the files (default: /tmp/<repo name>, the path the shipped configs read); "
        "e.g. --output-dir ~/models/Qwen2.5-0.5B-Instruct",
    )
    parser.add_argument(
        "--hf-token",
        metavar="TOKEN",
        default=None,
        help="Hugging Face access token for gated or private repos (default: $HF_TOKEN or the token saved by "
        "`hf auth login`); e.g. --hf-token hf_xxx",
    )
    parser.add_argument(
        "--ignore-patterns",
        action="append",
        metavar="PATTERN",
        default=None,
        help="glob of files not to download; repeat for several; e.g. --ignore-patterns 'original/consolidated*'",
    )
    parser.add_argument(
        "--revision",
        metavar="REV",
        default=None,
        help="branch, tag or commit to download (default: main); e.g. --revision v1.0",
    )


def run(args: argparse.Namespace) -> int:
    output_dir = (args.output_dir or Path("/tmp") / args.repo_id.rstrip("/").split("/")[-1]).expanduser()
    token = args.hf_token or None
    commit = _download(args.repo_id, args.revision, output_dir, token, args.ignore_patterns)
    record = {
        "repo_id": args.repo_id,
        "revision": commit,
        "requested_revision": args.revision or "main",
        "ignore_patterns": args.ignore_patterns or [],
        "downloaded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tune_version": tune.__version__,
    }
    _write_json(output_dir / RECORD_FILE, record)
    files = sorted(p.relative_to(output_dir).as_posix() for p in output_dir.rglob("*") if p.is_file())
    files = [f for f in files if not f.startswith(".cache/")]
    print(f"Downloaded {args.repo_id} ({commit[:12]}) to {output_dir}: {len(files)} files")
    for name in files:
        print(f"  {name}")
    return 0


def _download(repo_id: str, revision: str | None, output_dir: Path, token: str | None, ignore: list[str] | None) -> str:
    """Resolves the revision to a commit, downloads that commit, and returns its hash."""
    import huggingface_hub
    from huggingface_hub import errors

    try:
        info = huggingface_hub.HfApi(token=token).model_info(repo_id, revision=revision, timeout=_TIMEOUT_S)
        huggingface_hub.snapshot_download(
            repo_id,
            revision=info.sha,
            local_dir=output_dir,
            token=token,
            ignore_patterns=ignore,
            etag_timeout=_TIMEOUT_S,
        )
    except errors.GatedRepoError:
        raise TuneError(
            f"{repo_id} is gated: accept its license at https://huggingface.co/{repo_id}, then pass "
            "--hf-token TOKEN (or set HF_TOKEN)"
        ) from None
    except errors.RepositoryNotFoundError:
        raise TuneError(
            f"repository {repo_id!r} not found on the Hugging Face Hub (a private repo needs --hf-token TOKEN)"
        ) from None
    except errors.RevisionNotFoundError:
        raise TuneError(f"{repo_id} has no revision {revision!r} (a branch, tag or commit)") from None
    except errors.HFValidationError as err:
        raise TuneError(f"{repo_id!r} is not a valid repo id (expected owner/name): {err}") from None
    except errors.OfflineModeIsEnabled:
        raise TuneError(f"cannot download {repo_id}: HF_HUB_OFFLINE is set; unset it to use the network") from None
    except Exception as err:  # the network itself: DNS, refused connections, timeouts, HTTP 5xx
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
        reason = str(err).splitlines()[0] if str(err) else repr(err)
        raise TuneError(
            f"could not download {repo_id} from the Hugging Face Hub ({endpoint}): {type(err).__name__}: {reason}. "
            "Check the network connection (or HF_ENDPOINT and proxy settings) and try again."
        ) from None
    return info.sha


def _write_json(path: Path, record: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)

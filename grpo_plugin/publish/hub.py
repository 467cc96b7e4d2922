"""Publish a run's output dir to the Hugging Face Hub: one `create_repo` and ONE commit.

Uploaded: the adapter (`adapter_config.json`, `adapter_model.safetensors`) or, with `merge=True`,
full weights merged into a float32 reload of the base (this also works for an adapter trained on a
4-bit base; the card says so); the tokenizer files; a freshly built `README.md` model card;
`reward_curve.png`, `eval.json` and the recipe YAML. Checkpoints (with their optimizer states) and
completion logs only when asked for. `grpo_run.json` and `metrics.jsonl` stay local (they may hold
local paths).

The output dir is never modified: the card and merged weights are staged in a temporary dir.
`HF_ENDPOINT` and `HF_TOKEN` are read at call time (huggingface_hub reads `HF_ENDPOINT` only at
import). The token is passed to `HfApi` and nowhere else; error messages are scrubbed of it.

With `gguf=TYPE` (`--gguf q8_0`) the run is also exported as `NAME-TYPE.gguf` + its Ollama
Modelfile (`gguf.py`, into the staging dir) and both go into the same commit; the card then has a
"Run it locally" section.

CLI: `grpo-plugin publish OUTPUT_DIR --repo-id USER/NAME [--private] [--merge] [--revision BRANCH]
[--commit-message ...] [--gguf TYPE]` (`cli.py` parses it and calls `publish`).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi, constants, get_token
from huggingface_hub.errors import HfHubHTTPError

from ..run.lock import live_run
from ..run.rundir import (
    CARD_FILE,
    COMPLETIONS_DIR,
    CURVE_FILE,
    EVAL_FILE,
    METRICS_FILE,
)
from .card import build_model_card
from .weights import ADAPTER_FILES, base_model_ref, merge_adapter, model_kind

logger = logging.getLogger(__name__)

MODEL_PATTERNS = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
)
TOKENIZER_PATTERNS = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "spiece.model",
)
KIND_NAMES = {"adapter": "LoRA adapter", "full": "model"}
RUN_FILE_PATTERNS = (CURVE_FILE, EVAL_FILE, "*.yaml", "*.yml")
LOGIN_HELP = (
    "No Hugging Face token found. Create a token with write access at "
    "https://huggingface.co/settings/tokens, then run `hf auth login` (or set HF_TOKEN=hf_...)."
)


class HubPublishError(RuntimeError):
    """The Hub could not be reached or refused the upload; nothing local was changed."""


# ----------------------------------------------------------------------------- checks


def check_repo_id(repo_id: str) -> None:
    """Require `namespace/name` (the Hub would otherwise guess the namespace from the token)."""
    parts = str(repo_id).split("/")
    if len(parts) != 2 or not all(parts):
        raise ValueError(
            f"Repo id {repo_id!r} needs a namespace: use --repo-id USER/NAME (or ORG/NAME), "
            "e.g. --repo-id alice/smollm2-grpo-gsm8k."
        )
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except Exception as err:  # HFValidationError
        raise ValueError(f"Invalid repo id {repo_id!r}: {err}") from err


def resolve_token(token: str | None) -> str:
    token = token or get_token()
    if not token:
        raise ValueError(LOGIN_HELP)
    return token


# ----------------------------------------------------------------------------- files


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def select_files(
    output_dir: Path,
    *,
    kind: str,
    include_checkpoints: bool = False,
    include_completions: bool = False,
) -> dict[str, Path]:
    """`{path_in_repo: local_path}` of what to upload from `output_dir` (the card comes separately;
    with `kind="merged"` the weights come from the merge instead)."""
    top_level = TOKENIZER_PATTERNS + RUN_FILE_PATTERNS
    top_level += {"adapter": ADAPTER_FILES, "full": MODEL_PATTERNS, "merged": ()}[kind]
    files = {p.name: p for p in output_dir.iterdir() if p.is_file() and _matches(p.name, top_level)}
    files.pop(CARD_FILE, None)
    subdirs = []
    if include_checkpoints:
        subdirs += sorted(output_dir.glob("checkpoint-*"))
    if include_completions:
        subdirs.append(output_dir / COMPLETIONS_DIR)
    for subdir in subdirs:
        for path in sorted(subdir.rglob("*")):
            if path.is_file():
                files[path.relative_to(output_dir).as_posix()] = path
    return files


def _add_gguf(
    files: dict[str, Path], output_dir: Path, repo_id: str, quant: str, staging: Path
) -> str:
    """Export the run as `NAME-TYPE.gguf` + its Modelfile into `staging`, add both to `files`."""
    from .gguf import export_gguf

    paths = export_gguf(
        output_dir, staging / f"{repo_id.split('/')[-1]}-{quant.lower()}.gguf", quant
    )
    files.update({p.name: p for p in (paths.gguf, paths.modelfile)})
    return paths.gguf.name


_SCANNED_BYTES = 64 * 2**20  # weights above this size hold no text a token could hide in


def check_no_token(files: dict[str, Path], token: str) -> None:
    """Refuse to upload a file that holds the token (a recipe or log that a user or an older
    version wrote it into): one line naming the file, before anything leaves the machine."""
    needle = token.encode()
    for name, path in sorted(files.items()):
        if path.stat().st_size <= _SCANNED_BYTES and needle in path.read_bytes():
            raise ValueError(
                f"{path} holds your Hugging Face token, and publishing would upload it to "
                f"{name!r}: remove the token from that file (and revoke it if it was shared)."
            )


def _operations(files: dict[str, Path], card_text: str) -> list[CommitOperationAdd]:
    ops = [
        CommitOperationAdd(path_in_repo=k, path_or_fileobj=str(v)) for k, v in sorted(files.items())
    ]
    ops.append(CommitOperationAdd(path_in_repo=CARD_FILE, path_or_fileobj=card_text.encode()))
    return ops


# ----------------------------------------------------------------------------- upload


def _scrub(text: str, token: str) -> str:
    return text.replace(token, "***") if token else text


def _commit(
    api: HfApi,
    repo_id: str,
    operations: list[CommitOperationAdd],
    *,
    private: bool,
    revision: str | None,
    commit_message: str,
) -> str:
    api.create_repo(repo_id, private=private, exist_ok=True)
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    with warnings.catch_warnings():  # completions/*.parquet are uploaded only when asked for
        warnings.filterwarnings("ignore", message=".*commit a data file.*")
        info = api.create_commit(
            repo_id, operations, commit_message=commit_message, revision=revision
        )
    return info.commit_url


def _network_error(err: Exception, endpoint: str, repo_id: str, token: str) -> HubPublishError:
    status = getattr(getattr(err, "response", None), "status_code", None)
    if isinstance(err, HfHubHTTPError) and status in (401, 403):
        hint = (
            f"the Hub refused the token (HTTP {status}): it must have write access to "
            f"{repo_id.split('/')[0]!r}. Create one at https://huggingface.co/settings/tokens "
            "and run `hf auth login`."
        )
    else:
        hint = f"{type(err).__name__}: {err}"
    return HubPublishError(
        _scrub(
            f"Publishing {repo_id} to {endpoint} failed: {hint.rstrip('.')}. Nothing was committed "
            "(huggingface_hub retries transient errors itself) and the local output dir is "
            "unchanged; rerun the same command once the problem is fixed.",
            token,
        )
    )


@dataclass(frozen=True)
class PublishOptions:
    """What `publish` uploads and how: one field per `grpo-plugin push` flag (and the keywords
    of `GRPOTrainer.push_to_hub`)."""

    private: bool = False  # create the repo as private (an existing repo keeps its visibility)
    merge: bool = False  # upload a LoRA run merged into its base model (full weights)
    revision: str | None = None  # the branch to commit to (default: the repo's main branch)
    commit_message: str | None = None  # default: "Upload <what> trained with grpo-plugin"
    include_checkpoints: bool = False  # also upload the checkpoint-*/ folders
    include_completions: bool = False  # also upload the completions/ parquet files
    gguf: str | None = None  # a GGUF type (f16, q8_0, ...): also upload GGUF + Ollama Modelfile


def publish(
    output_dir: str | Path,
    repo_id: str,
    options: PublishOptions | None = None,
    *,
    token: str | None = None,
) -> str:
    """Upload a run's output dir as one commit, as `options` say (default `PublishOptions()`);
    returns the commit URL.

    Raises ValueError for a bad repo id, a run still training, a dir without adapter/model, a bad
    GGUF type or no token (before any network call) and HubPublishError when the Hub fails (after huggingface_hub's
    retries).
    """
    from .gguf import check_quant

    o = options or PublishOptions()
    merge, gguf = o.merge, o.gguf
    output_dir = Path(output_dir)
    check_repo_id(repo_id)
    live = live_run(output_dir)
    if live is not None and live[0] == output_dir:  # its weights are an older save, or none
        raise ValueError(
            f"{output_dir} is still training ({live[1]}); nothing was uploaded: wait for it to "
            "finish, then publish it."
        )
    if gguf:
        check_quant(gguf)
    kind = model_kind(output_dir)
    token = resolve_token(token)
    if constants.is_offline_mode():
        raise ValueError("HF_HUB_OFFLINE is set, so nothing can be uploaded; unset it to publish.")
    endpoint = (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    merged = merge and kind == "adapter"
    if merged:
        base_model_ref(output_dir)  # the base exists: checked before the upload is prepared
    if merge and kind == "full":
        logger.info("%s already holds full weights; --merge has nothing to merge.", output_dir)

    with tempfile.TemporaryDirectory(prefix="grpo-publish-") as staging:
        files = select_files(
            output_dir,
            kind="merged" if merged else kind,
            include_checkpoints=o.include_checkpoints,
            include_completions=o.include_completions,
        )
        if merged:
            merged_dir = merge_adapter(output_dir, Path(staging) / "merged")
            files.update(
                {p.name: p for p in merged_dir.iterdir() if _matches(p.name, MODEL_PATTERNS)}
            )
        gguf_file = _add_gguf(files, output_dir, repo_id, gguf, Path(staging)) if gguf else None
        check_no_token(files, token)
        if CURVE_FILE not in files:
            logger.warning("%s has no %s; the card will have no curve.", output_dir, CURVE_FILE)
        card = build_model_card(
            output_dir, merged=merged or kind == "full", repo_id=repo_id, gguf_file=gguf_file
        )
        message = (
            o.commit_message
            or f"Upload {'merged model' if merged else KIND_NAMES[kind]} trained with grpo-plugin"
        )
        api = HfApi(endpoint=endpoint, token=token, library_name="grpo-plugin")
        logger.info("Uploading %d files to %s/%s in one commit", len(files) + 1, endpoint, repo_id)
        try:
            url = _commit(
                api,
                repo_id,
                _operations(files, str(card)),
                private=o.private,
                revision=o.revision,
                commit_message=message,
            )
        except Exception as err:  # any network/HTTP failure: one clear error, token scrubbed
            raise _network_error(err, endpoint, repo_id, token) from err
    logger.info("Published %s: %s", repo_id, url)
    return url


# ----------------------------------------------------------------------------- CLI


def publish_trainer(trainer, repo_id: str | None, token: str | None, **kwargs) -> str:
    """`GRPOTrainer.push_to_hub`: save, plot, write the card, publish as one commit (`kwargs`:
    `PublishOptions` fields)."""
    from .card import write_model_card
    from .plot import plot_reward_curve

    if not repo_id:
        raise ValueError("push_to_hub needs repo_id='user/name' (or GRPOConfig.hub_model_id).")
    out = Path(trainer.args.output_dir)
    trainer.save_model(str(out))
    if (out / METRICS_FILE).exists():
        plot_reward_curve(out)
    write_model_card(out)
    return publish(out, repo_id, PublishOptions(**kwargs), token=token)

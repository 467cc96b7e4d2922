"""Checkpoints are complete or invisible: a write that fails leaves the earlier ones alone, a
half-written folder is never taken for complete, a full disk says so in one line."""

from __future__ import annotations

import errno
import json
import re

import pytest
import torch
from safetensors.torch import save_file

from grpo_plugin.run import checkpoints


def _complete(folder, step_state=True):
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, folder / "adapter_model.safetensors")
    if step_state:
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    return folder


def test_the_newest_complete_checkpoint_is_taken_and_partial_ones_skipped(tmp_path, caplog):
    _complete(tmp_path / "checkpoint-2")
    _complete(tmp_path / "checkpoint-10")
    _complete(tmp_path / "checkpoint-12", step_state=False)  # killed while writing
    (tmp_path / "checkpoint-14").mkdir()  # killed right after mkdir
    assert checkpoints.latest_complete(tmp_path) == tmp_path / "checkpoint-10"  # 10 > 2: by number
    assert checkpoints.resolve_resume(tmp_path, "true") == str(tmp_path / "checkpoint-10")
    assert checkpoints.resolve_resume(tmp_path, True) == str(tmp_path / "checkpoint-10")
    assert "checkpoint-14" in caplog.text and "checkpoint-12" in caplog.text
    assert checkpoints.resolve_resume(tmp_path, None) is None
    assert checkpoints.resolve_resume(tmp_path, False) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("checkpoint-12", "is incomplete (no trainer_state.json)"),
        ("checkpoint-99", "no such folder"),
        ("true", "has no complete checkpoint-N"),
    ],
)
def test_resume_errors_say_what_to_do(tmp_path, value, expected):
    _complete(tmp_path / "checkpoint-12", step_state=False)
    target = value if value == "true" else str(tmp_path / value)
    with pytest.raises(ValueError, match=re.escape(expected)):
        checkpoints.resolve_resume(tmp_path, target)


def _write_files(staged):
    staged.mkdir(parents=True)
    (staged / "adapter_model.safetensors").write_bytes(b"new")
    (staged / "trainer_state.json").write_text("{}")


def test_a_checkpoint_appears_only_when_complete(tmp_path):
    seen_during_write = []

    def write(staged):
        _write_files(staged)
        seen_during_write.append(sorted(p.name for p in tmp_path.iterdir()))

    final = checkpoints.write_atomically(tmp_path, 3, write, True, lambda: None)
    assert final == tmp_path / "checkpoint-3"
    assert seen_during_write == [[checkpoints.STAGING_DIR]]  # no checkpoint-3 while writing
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3"]  # staging gone
    assert (final / "adapter_model.safetensors").read_bytes() == b"new"


def test_a_failed_write_leaves_earlier_checkpoints_intact(tmp_path):
    earlier = _complete(tmp_path / "checkpoint-2")

    def write(staged):
        _write_files(staged)
        raise RuntimeError("killed half way")

    with pytest.raises(RuntimeError, match="killed half way"):
        checkpoints.write_atomically(tmp_path, 4, write, True, lambda: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2"]
    assert checkpoints.missing_files(earlier) == []


def test_a_full_disk_is_one_line_naming_the_dir_and_the_free_space(tmp_path):
    _complete(tmp_path / "checkpoint-2")

    def write(staged):
        staged.mkdir(parents=True)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(checkpoints.CheckpointWriteError) as caught:
        checkpoints.write_atomically(tmp_path, 4, write, True, lambda: None)
    message = str(caught.value)
    assert "\n" not in message
    assert f"Could not write checkpoint-4 in {tmp_path}: no space left" in message
    assert "MB free" in message and "intact (checkpoint-2)" in message
    assert not (tmp_path / "checkpoint-4").exists()


def test_torch_zip_writer_errors_on_a_full_disk_are_recognised(tmp_path):
    def write(staged):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")

    with pytest.raises(checkpoints.CheckpointWriteError, match="no space left"):
        checkpoints.write_atomically(tmp_path, 1, write, True, lambda: None)


def test_a_stale_folder_of_the_same_step_is_replaced(tmp_path):
    stale = _complete(tmp_path / "checkpoint-3", step_state=False)
    (stale / "junk").write_text("from the interrupted run")
    checkpoints.write_atomically(tmp_path, 3, _write_files, True, lambda: None)
    assert sorted(p.name for p in (tmp_path / "checkpoint-3").iterdir()) == [
        "adapter_model.safetensors",
        "trainer_state.json",
    ]


def test_a_damaged_checkpoint_is_refused_naming_the_file_and_the_earlier_whole_one(tmp_path):
    _complete(tmp_path / "checkpoint-2")
    newest = _complete(tmp_path / "checkpoint-4")
    weights = newest / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-3])  # cut short
    for value in ("true", str(newest)):
        with pytest.raises(ValueError) as caught:
            checkpoints.resolve_resume(tmp_path, value)
        assert str(caught.value) == (
            f"{weights} is damaged: it holds {weights.stat().st_size} bytes where its header "
            f"describes {weights.stat().st_size + 3}. Nothing was changed; restore the file from a "
            "copy, or resume from the earlier whole checkpoint with --resume_from_checkpoint "
            f"{tmp_path / 'checkpoint-2'}."
        )
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{")  # no whole one left
    with pytest.raises(ValueError, match="or start over with --overwrite_output_dir"):
        checkpoints.resolve_resume(tmp_path, "true")


def test_a_run_file_a_resume_reads_must_parse(tmp_path):
    _complete(tmp_path / "checkpoint-2")
    (tmp_path / "eval.json").write_text('{"before": {"accuracy": 0.')  # cut short
    with pytest.raises(ValueError, match=r"eval.json is damaged: it is not valid JSON .* fix or"):
        checkpoints.resolve_resume(tmp_path, "true")


def test_a_checkpoint_set_aside_by_an_earlier_resume_is_refused(tmp_path):
    aside = _complete(tmp_path / "abandoned" / "after-step-2-20261206-120000" / "checkpoint-4")
    _complete(tmp_path / "checkpoint-2")
    assert checkpoints.resolve_resume(tmp_path, "true") == str(tmp_path / "checkpoint-2")
    with pytest.raises(ValueError, match="belongs to a timeline an earlier resume set aside"):
        checkpoints.resolve_resume(tmp_path, str(aside))

"""The Trainer's hooks into the run folder, as a mixin of `GRPOTrainer`: `train()` with its lock
and exact resume, atomic checkpoints (written to a staging folder, then renamed), the saved model
with `grpo_run.json`, and publishing (`push_to_hub`, `save_gguf`). The logic is in `run/` and
`publish/`; these methods are the transformers overrides that call it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..publish.gguf import save_trainer_gguf
from ..run import checkpoints, lifecycle, resume, rundir
from ..run.state import mid_rollout


class RunHooks:
    """`transformers.Trainer` overrides for the run folder (`run/lifecycle.py` has the logic)."""

    _staging_dir: str | None = None  # where a checkpoint is being written (lifecycle.py)

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, **kwargs):
        """`Trainer.train`, plus: the output dir locked (one run at a time, no silent rerun
        mixing), an exact resume (`True`: the newest complete checkpoint), and SIGTERM or a first
        Ctrl-C saving a checkpoint before `TrainingInterrupted` is raised."""
        try:
            return lifecycle.train(
                self, super().train, resume_from_checkpoint, trial=trial, **kwargs
            )
        finally:
            self._sampler.close()  # the vLLM engine, if any, before the process exits

    def _get_output_dir(self, trial) -> str:
        return self._staging_dir or super()._get_output_dir(trial)

    def _save_checkpoint(self, model, trial) -> None:
        save = self._save_staged
        push = self._push_from_checkpoint  # transformers' (private): a checkpoint to the Hub
        lifecycle.save_checkpoint(self, lambda d: save(model, trial, d), push)

    def _save_staged(self, model, trial, staging: str) -> None:
        """The Trainer's own checkpoint saving, into `staging` (pushed once renamed)."""
        push, self.args.push_to_hub = self.args.push_to_hub, False
        self._staging_dir = staging
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_dir, self.args.push_to_hub = None, push

    def save_run_state(self, checkpoint: Path) -> None:
        """This process's `RunState` (main process: also the loss's entropy state) into `checkpoint`."""
        state = self.run_state.state_dict(mid_rollout(self.args, self.state.global_step))
        checkpoints.save_state(checkpoint, self.args.process_index, state)
        if self.is_world_process_zero():
            self.training_objective.save_state(checkpoint)  # TRL's entropy_ctrl_state.json

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, *a):
        epochs, steps = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, *a
        )
        return lifecycle.skip_when_done(self.state, epochs, steps, num_train_epochs)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        super()._load_optimizer_and_scheduler(checkpoint)
        self.training_objective.load_state(checkpoint)  # the adaptive entropy coefficient, as TRL
        resume.after_restore(self, checkpoint)  # the schedule as configured, at the restored step
        lifecycle.after_load(self, checkpoint)  # the run state; then what came after it set aside

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call)
        if self.is_world_process_zero():
            out = Path(output_dir or self.args.output_dir)
            rundir.write_json(out / rundir.RUN_INFO_FILE, self.run_summary())

    def run_summary(self) -> dict[str, Any]:
        """The run facts that model cards need (`grpo_run.json`)."""
        return rundir.trainer_summary(self)

    def push_to_hub(self, repo_id: str | None = None, *, token: str | None = None, **kwargs) -> str:
        """Save, plot, write the card, publish as one commit (kwargs: `publish/hub.py` publish)."""
        from ..publish.hub import publish_trainer

        return publish_trainer(
            self, repo_id or self.args.hub_model_id, token or self._hub_token, **kwargs
        )

    def save_gguf(self, path: str | Path, quant: str = "f16", *, overwrite: bool = False) -> Any:
        """Save the run, then write it as one GGUF + an Ollama Modelfile (`publish/gguf.py`)."""
        return save_trainer_gguf(self, path, quant, overwrite)

"""Models: which model a name means and loading it.

- `embedded.py`: the embedded SmolLM2-135M-Instruct, turned from its `embedded:` name into a
  local directory (nothing downloaded); its names are re-exported here;
- `hub_access.py`: whether the Hugging Face Hub can be reached, asked before fetching;
- `weight_files.py`: a local model or adapter folder's weight files, checked unloaded;
- `setup_checks.py`: the policy's setup (LoRA, a rollout copy, the reference) checked before it loads;
- `policy.py`: the one loading path: full, LoRA, 4-bit; the reference model;
- `liger.py`: `use_liger_kernel`, decided per case with TRL's reasons.
"""

from .embedded import (
    EMBEDDED_HUB_ID,
    EMBEDDED_LICENSE,
    EMBEDDED_NAME,
    check_embedded_name,
    is_embedded,
    resolve_model_path,
)

__all__ = [
    "EMBEDDED_HUB_ID",
    "EMBEDDED_LICENSE",
    "EMBEDDED_NAME",
    "check_embedded_name",
    "is_embedded",
    "resolve_model_path",
]

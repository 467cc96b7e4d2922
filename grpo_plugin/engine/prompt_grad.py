"""One prompt encoded once with grad, shared by every micro-batch of its group.

When a group of G completions is split over several micro-batches (`per_device_train_batch_size`
< `num_generations`), the prefix-shared training forward would encode the group's prompt again
in every micro-batch, forward and backward. `SharedPromptGrad` keeps the prompt's keys and values
(with their autograd graph) from the group's first micro-batch instead:

- each micro-batch runs its completions against detached copies of them (leaves), expanded to its
  rows, so the micro-batch's own backward stops at the leaves and their `.grad` accumulates over
  the group's micro-batches;
- after the group's last backward (or at the end of the optimizer step, whichever comes first),
  one backward pass carries the accumulated grads through the prompt's graph into the weights.

By the chain rule the weights' gradient is the one of encoding the prompt in every micro-batch
(the prompt's part summed over the micro-batches first), so the result is exact up to float
summation order. It costs one group's prompt activations held from its first micro-batch to its
last; it saves (micro-batches per group - 1) prompt encodings, forward and backward.

The extra backward pass is a second backward per micro-batch, which DDP's reducer does not allow
within one step: the trainer uses this in single-process runs only.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .._compat import cache_tensors, dynamic_cache_of

__all__ = ["SharedPromptGrad"]


class SharedPromptGrad:
    """The prompt of the group in progress: its graph tensors, their leaf copies, rows served."""

    def __init__(self, group_size: int):
        self.group_size = group_size  # G: rows that share one prompt
        self.encodings = 0  # prompts encoded so far (what the tests and the benchmark read)
        self.unsupported = False  # the model's cache is not plain DynamicLayers: never again
        self._clear()

    def _clear(self) -> None:
        self._key: tuple[torch.Tensor, torch.Tensor] | None = None  # (1, Lp - 1) ids and mask
        self._graph: list[torch.Tensor] = []  # keys, values of every layer, attached to the graph
        self._leaves: list[torch.Tensor] = []  # the same, detached; their .grad accumulates
        self._rows = 0  # rows of the held prompt run so far

    @property
    def holds_prompt(self) -> bool:
        return self._key is not None

    def cache_for(
        self,
        prompt_ids: torch.LongTensor,
        prompt_mask: torch.LongTensor,
        rows: int,
        encode: Callable[[], object],
    ):
        """A `DynamicCache` of the prompt `(1, Lp - 1)` expanded to `rows` rows, built on the held
        prompt's leaves when it is the same prompt, else on a new encoding (`encode()` runs the
        prefix forward with grad and returns its cache; the prompt held before is flushed
        first). None when the model's cache kind is not supported (nothing is held then)."""
        if self.unsupported:
            return None
        if not self._same_prompt(prompt_ids, prompt_mask):
            self.flush()
            tensors = cache_tensors(encode())
            if tensors is None:
                self.unsupported = True
                return None
            self._graph = [t for pair in tensors for t in pair]
            self._leaves = [t.detach().requires_grad_(t.requires_grad) for t in self._graph]
            self._key = (prompt_ids.clone(), prompt_mask.clone())
            self.encodings += 1
        self._rows += rows
        expanded = [t.expand(rows, *t.shape[1:]) for t in self._leaves]  # (rows, heads, Lp-1, d)
        return dynamic_cache_of(list(zip(expanded[0::2], expanded[1::2])))

    def _same_prompt(self, prompt_ids, prompt_mask) -> bool:
        if self._key is None:
            return False
        ids, mask = self._key
        return (
            ids.shape == prompt_ids.shape
            and torch.equal(ids, prompt_ids)
            and torch.equal(mask, prompt_mask)
        )

    def after_backward(self, step_ends: bool) -> None:
        """Call after each micro-batch's backward: flushes once the group's G rows have run, or
        at the end of the optimizer step (a group never spans two steps, but never leave one
        pending across `optimizer.step()`)."""
        if self._key is not None and (step_ends or self._rows >= self.group_size):
            self.flush()

    def flush(self) -> None:
        """Backward through the held prompt's graph with its leaves' accumulated grads."""
        pairs = [
            (graph, leaf.grad)
            for graph, leaf in zip(self._graph, self._leaves)
            if leaf.grad is not None and graph.requires_grad
        ]
        self._clear()
        if pairs:
            torch.autograd.backward([g for g, _ in pairs], [d for _, d in pairs])

    def discard(self) -> None:
        """Drop the held prompt without a backward pass (the step failed)."""
        self._clear()

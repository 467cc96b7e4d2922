"""Padding-free completion forward: the model's matrix products run on real tokens only.

In the prefix-shared training forward (`logprobs.py`) every completion row is as wide as the
longest completion of the micro-batch, and the layers' linear maps (three quarters of the
training step's time on a CPU) run over the padding too. Here the completion tokens that matter
are packed into ONE row `(1, M)` instead of `(N, T)`:

- a row keeps its tokens up to its last real target (the hidden state at slot t predicts
  completion token t), padding included only where it sits inside a completion;
- the projections, MLPs and norms see `M` tokens; RoPE takes each token's own position;
- attention alone goes back to the row layout: queries, keys and values are gathered to
  `(N, heads, T | L + T, d)` (keys: the row's prompt, encoded once per group, then its own
  suffix), attention runs there under the same mask as the padded forward, and the output is
  gathered back to the packed tokens (`kernels.rows_attention_for_packed_tokens` routes the
  model's SDPA call here when it carries `packed_rows`).

Every real token therefore sees exactly the keys it sees in the padded forward: the result is
the padded one up to float summation order (tests: log-probs and gradients to 1e-5 relative).

With the prompts inline (`packed_hidden_with_prompts`, the default when a micro-batch holds its
groups' prompts) the same row starts with the P prompts' L tokens each, and ONE forward encodes
them and runs the completions: each layer's products, norms and MLP run once over P*L + M tokens
instead of once in a prompt forward and once in a completion forward, and the prompts' queries
attend within their own prompt in the row layout `(P, heads, L, d)`. SmolLM2's `short` forward +
backward is faster this way (docs/benchmarks.md, round three, "the prompts inline").
The same packing as TRL's `padding_free` and flash-attention's varlen kernels, for SDPA, where
attention keeps the row layout so no (M x M) mask is built.

It runs when every attention layer of the model went through the wrapped SDPA entry (counted);
otherwise, and for models whose cache is not plain per-layer key/value tensors, the caller runs
the padded forward (a warning says so once).
"""

from __future__ import annotations

import weakref

import torch

from .._compat import cache_argument_name, dynamic_cache_of
from .._logging import warn_once
from .kernels import rows_attention_for_packed_tokens

__all__ = ["PackedRows", "packed_hidden_with_prompts", "packed_suffix_hidden"]

_MIN_SAVED = 1 / 16  # pack only when it removes at least this share of the (N x T) slots
_UNSUPPORTED: weakref.WeakSet = weakref.WeakSet()  # bodies whose attention did not route here


def _matmul_attention_fits(width: int, head_dim: int, device: torch.device) -> bool:
    """`PackedRows.attend` keeps `(N, heads, T, L + T)` probabilities for backward, where SDPA
    keeps the key and value heads copied out `(2, N, heads, L + T, d)`: no more memory while
    T <= 2 d. On a CPU only: measured there; a GPU keeps its SDPA kernels (not measured)."""
    return device.type == "cpu" and width <= 2 * head_dim


class PackedRows:
    """Where each real token of an `(N, T)` suffix sits in the packed row, and the attention mask
    of the row layout.

    `prefix_mask` `(N, L)`: the prompt tokens held in the cache (row r uses prompt r // group);
    `suffix_mask` `(N, T)`: which suffix inputs are real (the last prompt token, then the
    completion tokens but the last); `target_mask` `(N, T)`: which slots predict a real token."""

    def __init__(
        self, prefix_mask, suffix_mask, target_mask, group: int, prompts_inline: bool = False
    ) -> None:
        rows, width = target_mask.shape
        prompt_width = prefix_mask.size(1)
        device = target_mask.device
        slots = torch.arange(width, device=device)
        last = torch.where(target_mask.bool(), slots, -1).amax(1)  # (N,) last real target
        self.kept = slots[None] <= last[:, None]  # (N, T) slots that run
        self.token_index = self.kept.reshape(-1).nonzero().squeeze(1)  # (M,) into N*T
        tokens = self.token_index.numel()
        slot_token = torch.zeros(rows * width, dtype=torch.long, device=device)  # (N*T,)
        slot_token[self.token_index] = torch.arange(tokens, device=device)  # dropped slots -> 0
        self.query_index = slot_token
        prompt_cols = (torch.arange(rows, device=device) // group)[:, None] * prompt_width
        prompt_cols = prompt_cols + torch.arange(prompt_width, device=device)  # (N, L)
        suffix_cols = (rows // group) * prompt_width + slot_token.view(rows, width)  # (N, T)
        self.key_index = torch.cat([prompt_cols, suffix_cols], 1).reshape(-1)  # (N*(L+T),)
        self.rows, self.width, self.prompt_width, self.tokens = rows, width, prompt_width, tokens
        self.group = group
        self._key_masks = (prefix_mask.bool(), suffix_mask.bool())  # the mask is built on first use
        self._masks: dict[torch.dtype, torch.Tensor] = {}
        # `prompts_inline`: the packed row starts with the P prompts' L tokens each (P*L), which
        # the same forward encodes (their queries attend within their prompt) instead of a cache
        self.prompt_tokens = (rows // group) * prompt_width if prompts_inline else 0
        self._prompt_masks: dict[torch.dtype, torch.Tensor] = {}
        self.calls = 0  # attention layers that ran through `to_rows` (the caller checks them)

    def _allowed_keys(self, prefix_mask, suffix_mask) -> torch.Tensor:
        """`(N, 1, T, L + T)`: the padded forward's mask (prompt keys where real; suffix keys
        causal and real). A dropped slot's query sees only its own slot, so that its (unused)
        softmax stays finite."""
        rows, width, prompt_width = self.rows, self.width, self.prompt_width
        causal = torch.ones(width, width, dtype=torch.bool, device=suffix_mask.device).tril()
        suffix = causal[None] & (suffix_mask & self.kept)[:, None, :]  # (N, T, T)
        suffix |= torch.diag_embed(~self.kept)
        prompt = prefix_mask[:, None, :].expand(rows, width, prompt_width)  # (N, T, L)
        return torch.cat([prompt, suffix], 2)[:, None]

    def worth_packing(self, head_dim: int) -> bool:
        """Pack when it drops at least 1/16 of the `(N, T)` slots, or when the rows are narrow
        enough for `attend`, whose attention beats the padded forward's SDPA even with nothing
        to drop (measured: docs/benchmarks.md, round three)."""
        drops_enough = self.tokens <= (1 - _MIN_SAVED) * self.rows * self.width
        return drops_enough or _matmul_attention_fits(self.width, head_dim, self.kept.device)

    def mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The additive attention mask `(N, 1, T, L + T)` in `dtype` (built once per dtype)."""
        if dtype not in self._masks:
            allowed = self._allowed_keys(*self._key_masks)
            blocked = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            self._masks[dtype] = blocked.masked_fill_(~allowed, torch.finfo(dtype).min)
        return self._masks[dtype]

    def prompt_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The additive mask `(P, 1, L, L)` of the inline prompts' own attention: causal over
        their real tokens; a padding query sees only itself (its output is never read)."""
        if dtype not in self._prompt_masks:
            prefix = self._key_masks[0][:: self.group]  # (P, L)
            width = prefix.size(1)
            causal = torch.ones(width, width, dtype=torch.bool, device=prefix.device).tril()
            allowed = causal[None] & prefix[:, None, :]
            allowed |= torch.eye(width, dtype=torch.bool, device=prefix.device)
            blocked = torch.zeros(allowed.shape, dtype=dtype, device=prefix.device)
            self._prompt_masks[dtype] = blocked.masked_fill_(~allowed, torch.finfo(dtype).min)[
                :, None
            ]
        return self._prompt_masks[dtype]

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """`(N, T, ...)` -> `(1, M, ...)`: the kept slots, row after row."""
        return x.reshape(self.rows * self.width, *x.shape[2:]).index_select(0, self.token_index)[
            None
        ]

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """`(1, M, H)` -> `(N, T, H)`, zeros at the dropped slots."""
        flat = packed.new_zeros(self.rows * self.width, packed.size(-1))
        return flat.index_copy(0, self.token_index, packed[0]).view(self.rows, self.width, -1)

    def to_rows(self, query, key, value, sliding_window=None):
        """Packed `(1, heads, M | P*L + M, d)` -> row layout `(N, heads, T | L + T, d)`, and the
        mask. A windowed layer is not counted: this mask has no window (the caller falls back)."""
        self.calls += sliding_window is None

        def rows_of(x, index, width):
            picked = x[0].index_select(1, index)  # (heads, N * width, d)
            return picked.view(x.size(1), self.rows, width, x.size(3)).transpose(0, 1)

        full = self.prompt_width + self.width
        return (
            rows_of(query, self.query_index, self.width),
            rows_of(key, self.key_index, full),
            rows_of(value, self.key_index, full),
            self.mask(query.dtype),
        )

    def attend(self, query, key, value, mask, options: dict) -> torch.Tensor | None:
        """Attention in the row layout by plain matrix products, each key/value head shared by
        its group of query heads without copying it out: `(N, T, heads, d)`, as transformers'
        SDPA entry returns. None where SDPA must run instead: dropout or a position bias in
        `options` (the attention call's keywords), rows wider than 2 x head dim, where the
        `(N, heads, T, L + T)` probabilities kept for backward outgrow the copied keys and values
        SDPA keeps, or a device other than the CPU. For a training micro-batch's small rows on a
        CPU this is faster than SDPA's flash kernel forward + backward (measured on SmolLM2's
        shapes: docs/benchmarks.md, history, "attention by matrix products"), the same sums up
        to rounding."""
        rows, heads, width, dim = query.shape
        kv_heads, keys = key.shape[1], key.shape[2]
        plain = not options.get("dropout") and options.get("position_bias") is None
        if not plain or heads % kv_heads or not _matmul_attention_fits(width, dim, query.device):
            return None
        group = heads // kv_heads
        scale = options.get("scaling") or dim**-0.5
        grouped = query.reshape(rows, kv_heads, group * width, dim)  # heads of a group stacked
        scores = torch.matmul(grouped, key.transpose(-1, -2))  # (N, kv_heads, group*T, L+T)
        scores = scores.view(rows, kv_heads, group, width, keys) * scale + mask[:, :, None]
        probs = scores.softmax(-1, dtype=torch.float32).to(query.dtype)
        out = torch.matmul(probs.view(rows, kv_heads, group * width, keys), value)
        return out.view(rows, heads, width, dim).transpose(1, 2)  # (N, T, heads, d)

    def from_rows(self, out: torch.Tensor) -> torch.Tensor:
        """Attention output `(N, T, heads, d)` -> `(1, M, heads, d)`."""
        return self.pack(out)

    def attention(self, module, query, key, value, options: dict, sdpa) -> torch.Tensor:
        """The attention of the packed row: `(1, heads, S, d)` queries (S = M, or P*L + M with
        inline prompts), `(1, kv heads, P*L + M, d)` keys and values -> `(1, S, heads, d)`.
        `sdpa(module, q, k, v, mask, **options)` is transformers' SDPA entry, for what `attend`
        leaves to it."""
        inline = self.prompt_tokens

        def in_rows(q, k, v, mask):  # row layout -> (R, T, heads, d): `attend`, else SDPA
            out = self.attend(q, k, v, mask, options)
            return out if out is not None else sdpa(module, q, k, v, mask, **options)[0]

        suffix = self.to_rows(query[:, :, inline:], key, value, options.get("sliding_window"))
        out = self.from_rows(in_rows(*suffix))  # (1, M, heads, d)
        if not inline:
            return out
        rows = (self.rows // self.group, self.prompt_width)  # (P, L)

        def prompt_rows(x):  # (1, h, P*L, d) -> (P, h, L, d)
            return x[0, :, :inline].unflatten(1, rows).transpose(0, 1)

        parts = (prompt_rows(query), prompt_rows(key), prompt_rows(value))
        prompts = in_rows(*parts, self.prompt_mask(query.dtype))  # (P, L, heads, d)
        return torch.cat([prompts.flatten(0, 1)[None], out], 1)  # (1, P*L + M, heads, d)


def _one_row_per_prompt(tensor: torch.Tensor, layout: PackedRows) -> torch.Tensor:
    """A cache tensor `(P | N, heads, L, d)` -> `(1, heads, P*L, d)`: the prompts side by side."""
    prompts = tensor[:: layout.group] if tensor.size(0) == layout.rows else tensor  # (P, h, L, d)
    heads, dim = prompts.size(1), prompts.size(3)
    return prompts.transpose(0, 1).reshape(1, heads, -1, dim)


def _unsupported(body, why: str) -> None:
    """Remember that `body` cannot run packed, and say so once."""
    _UNSUPPORTED.add(body)
    warn_once(
        "padding-free",
        f"padding_free: {why}; using the padded training forward (same result, slower).",
    )


def packed_suffix_hidden(body, prefix, layout: PackedRows, suffix_ids, positions):
    """The body over the packed suffix against the prompts' `prefix` (`cache_tensors` of the
    prefix cache: one row per prompt, or expanded to the N rows); `(N, T, H)` hidden states
    (zeros at dropped slots), or None when this body cannot run packed (the caller pads).
    `suffix_ids`, `positions`: `(N, T)`."""
    if body in _UNSUPPORTED:
        return None
    flat = [tuple(_one_row_per_prompt(t, layout) for t in pair) for pair in prefix]
    packed = (layout.pack(suffix_ids), layout.pack(positions))  # (1, M) each
    cache = {cache_argument_name(body): dynamic_cache_of(flat), "use_cache": True}
    hidden = _packed_body(body, layout, *packed, cache, layers=len(prefix))
    return None if hidden is None else layout.unpack(hidden)


def packed_hidden_with_prompts(body, layout: PackedRows, prompts, suffix_ids, positions):
    """The prompts and the packed suffix in ONE forward of one row (`layout.prompt_tokens`
    set): the P prompts' L tokens each `(P*L)`, then the suffix's real tokens `(M)`. The prompts'
    queries attend within their prompt, the suffix's to its prompt and itself, exactly as against
    a prefix cache, but every layer's products, norms and MLP run once over P*L + M tokens
    instead of a prompt forward and a suffix forward. `prompts`: `(ids, positions)` `(P, L)`
    each; `suffix_ids`, `positions` `(N, T)`. `(N, T, H)` hidden states, or None (as above)."""
    if body in _UNSUPPORTED:
        return None
    ids = torch.cat([prompts[0].reshape(1, -1), layout.pack(suffix_ids)], 1)  # (1, P*L + M)
    where = torch.cat([prompts[1].reshape(1, -1), layout.pack(positions)], 1)
    layers = getattr(body.config, "num_hidden_layers", None)
    hidden = _packed_body(body, layout, ids, where, {"use_cache": False}, layers=layers)
    return None if hidden is None else layout.unpack(hidden[:, layout.prompt_tokens :])


def _packed_body(body, layout: PackedRows, ids, positions, cache: dict, layers):
    """`(1, S, H)` last hidden states of the body over one packed row, or None when this body
    cannot run packed (remembered, with one warning)."""
    if not rows_attention_for_packed_tokens(body):
        kind = getattr(body.config, "_attn_implementation", None)
        _unsupported(body, f"the model attends with {kind!r}, not 'sdpa'")
        return None
    try:
        out = body(
            input_ids=ids,
            attention_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool, device=ids.device),
            position_ids=positions,
            packed_rows=layout,
            **cache,
        )
    except TypeError as error:  # a forward that takes no extra keywords (remote code)
        if "packed_rows" not in str(error):
            raise
        _unsupported(body, f"the model's forward does not pass attention keywords on ({error})")
        return None
    if layout.calls != layers:
        _unsupported(
            body,
            f"{layout.calls} of {layers} attention layers ran through the packed SDPA path "
            "(sliding windows or a custom attention)",
        )
        return None
    return out.last_hidden_state

"""A KV cache of preallocated slots for B requests, written by position (gpt-fast style).

Speculative decoding feeds a tree (or chain) of tokens per request, keeps the accepted
path and throws the rest away. gpt-fast keeps one preallocated cache and writes new
entries by position, so rejected entries are simply overwritten by the next step; vLLM
does the same per request through its slot mapping. `SlotKV` does it for a batch of rows
of one Hugging Face causal LM:

* row r's committed entries fill slots [0, length[r]); slot index = position id;
* a forward writes n new entries per row at slots length[r] + pending + j and returns
  their logits; every row sees its committed entries plus the new entries its `attend`
  matrix allows (a tree mask), through one 4-D boolean mask per step;
* `commit(keep)` moves the kept new entries of each row (e.g. the accepted path) to
  length[r], length[r] + 1, ... and forgets the rest;
* rows leave (`drop`) and join (`append`) between steps: static (lockstep) and
  continuous batching.

Rows of different lengths share one slot range up to the longest row (the padding a
static batch pays); the mask hides what a row does not own. The model never sees
padding positions in its position ids, so every row's logits equal those of the row
decoded alone (up to floating-point reduction order).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from specsim.errors import ModelError

# transformers 5.2x renamed a forward's KV cache, keyword and output field, from `past_key_values` to `cache` (the old
# name still works there, with a deprecation warning on every run): pass and read whichever this transformers has.
CACHE_KEY = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def with_cache(cache) -> dict:
    """A forward's keyword for its KV cache: ``model(..., **with_cache(cache))``."""
    return {CACHE_KEY: cache}


def cache_of(out):
    """The KV cache a forward returned."""
    return getattr(out, CACHE_KEY)


class _SlotCache(Cache):
    """The transformers `Cache` a forward writes through: scatter into slots, return the used range."""

    def __init__(self, owner: "SlotKV"):
        super().__init__(layers=[])
        self.owner = owner

    def update(self, key_states, value_states, layer_idx, cache_kwargs=None, **kwargs):
        # transformers >= 5.2x passes the layer's attention kwargs as `kwargs=`; a slot write needs none
        return self.owner._update(key_states, value_states, layer_idx)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.owner.lengths.max(initial=0))

    @property
    def is_compileable(self) -> bool:
        return False


class SlotKV:
    """One causal LM and its slot cache for a batch of rows; see the module docstring."""

    def __init__(self, model, *, keep_hidden: tuple[str, ...] = ()) -> None:
        self.model = model
        # the target states a head draft reads, kept from the last forward side by side: "last" (the LM head's
        # input), "prenorm" (before the final norm: MiMo's MTP) and/or layer numbers k (the input of decoder layer k:
        # EAGLE-3's fused layers); () keeps none
        self.keep_hidden = tuple(keep_hidden)
        self.hidden: torch.Tensor | None = None  # (B, n, F) of the last forward, when keep_hidden
        params = next(model.parameters())
        self.device = params.device
        self.lengths = np.zeros(0, dtype=np.int64)  # (B,) committed entries per row
        self.pending = 0  # entries written after each row's length since the last commit
        self._keys: list[torch.Tensor] = []  # per layer (B, H_kv, capacity, d); values the same but their own d
        self._values: list[torch.Tensor] = []
        self._capacity = 0
        self._write: torch.Tensor | None = None  # (B, n) slots the forward in progress writes
        self._used = 0  # slots the forward in progress attends over
        self._cache = _SlotCache(self)

    # -- rows -----------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    def start(self, prompts: Sequence[np.ndarray]) -> None:
        """Forget every row; row r becomes `prompts[r]` (committed, one right-padded forward)."""
        self.lengths = np.zeros(len(prompts), dtype=np.int64)
        self.pending = 0
        self._keys, self._values, self._capacity = [], [], 0
        self.feed_chains(prompts, logits=False)

    @torch.inference_mode()
    def fill_random(self, rows: int, context: int, generator: torch.Generator) -> None:
        """Forget every row; each becomes `context` committed entries of random keys and values, without running the
        model over them: for timing, since what a forward costs does not depend on what its cache holds (a prefill of
        B x L tokens cost a profile more than the forwards it timed). One 1-token forward per row allocates the
        layers' buffers with the model's own shapes and dtype."""
        self.start([np.zeros(1, dtype=np.int64)] * rows)
        self._grow(context)
        for buf in (*self._keys, *self._values):
            buf[:, :, :context].normal_(generator=generator)
        self.lengths = np.full(rows, context, dtype=np.int64)

    @torch.inference_mode()
    def append(self, other: "SlotKV") -> None:
        """Add other's rows after this one's (continuous batching: requests that just prefilled)."""
        if self.pending or other.pending:
            raise RuntimeError("rows join only between steps (nothing pending)")
        if not self.rows:
            self.lengths, self._keys, self._values, self._capacity = (
                other.lengths.copy(), other._keys, other._values, other._capacity)
            return
        cap = max(self._capacity, other._capacity)  # both exactly this wide: growing alone may double past it
        self._grow(cap, exact=True)
        other._grow(cap, exact=True)
        self._keys = [torch.cat([a, b]) for a, b in zip(self._keys, other._keys)]
        self._values = [torch.cat([a, b]) for a, b in zip(self._values, other._values)]
        self.lengths = np.concatenate([self.lengths, other.lengths])

    @torch.inference_mode()
    def drop(self, keep: np.ndarray) -> None:
        """Keep only rows `keep` (in that order): finished requests leave the batch."""
        if self.pending:
            raise RuntimeError("rows leave only between steps (nothing pending)")
        keep = np.asarray(keep, dtype=np.int64)
        index = torch.as_tensor(keep, device=self.device)
        self._keys = [k.index_select(0, index) for k in self._keys]
        self._values = [v.index_select(0, index) for v in self._values]
        self.lengths = self.lengths[keep]

    # -- forward passes ---------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, tokens: np.ndarray, depth: np.ndarray, attend: np.ndarray, *, logits: bool = True,
                visible: np.ndarray | None = None):
        """Write n new entries per row and return their next-token logits (B, n, V) float32.

        tokens (B, n) int: the new tokens (rows that have none for a slot pass any id and
        let no valid token attend to it). depth (B, n) or (n,): position id minus the row's
        committed length. attend (B, n, pending + n) or (n, pending + n) bool: which of the
        row's uncommitted entries (written earlier this step, then these) each new token sees,
        itself included; every committed entry is always seen, unless `visible` (B, n) caps how
        many of the row's committed entries each new token sees (the first visible[r, i]: the
        prefix a token of a tree drafted at an earlier position of a recorded sequence sees).
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        B, n = tokens.shape
        if B != self.rows:
            raise ValueError(f"tokens for {B} rows, the cache holds {self.rows}")
        depth = np.broadcast_to(np.asarray(depth, dtype=np.int64), (B, n))
        attend = np.broadcast_to(np.asarray(attend, dtype=bool), (B, n, self.pending + n))
        base = self.lengths + self.pending  # (B,) first slot written
        self._used = int((base + n).max())
        self._grow(self._used)
        dev = self.device
        self._write = torch.as_tensor(base[:, None] + np.arange(n)[None, :], device=dev)  # (B, n)
        mask = self._mask(attend, visible)  # (B, 1, n, used)
        ids = torch.as_tensor(tokens, device=dev)
        positions = torch.as_tensor(self.lengths[:, None] + depth, device=dev)  # (B, n)
        if self.keep_hidden:  # the base model, then the LM head: the same logits, and the state they came from
            from specsim.record.head_unroll import base_states

            out, states = base_states(getattr(self.model, self.model.base_model_prefix), self.keep_hidden,
                                      input_ids=ids, attention_mask=mask, position_ids=positions,
                                      use_cache=True, **with_cache(self._cache))
            self.hidden = states[0] if len(states) == 1 else torch.cat(states, dim=-1)
            out_logits = self.model.get_output_embeddings()(out.last_hidden_state) if logits else None
        else:
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                             **with_cache(self._cache), logits_to_keep=0 if logits else 1)
            out_logits = out.logits if logits else None
        self.pending += n
        self._write = None
        return out_logits.float() if logits else None

    def feed_chains(self, chains: Sequence[np.ndarray], *, logits: bool = True):
        """Append a causal chain to every row (row lengths may differ) and commit it.

        Returns the logits after each row's last token, (B, V), or None with logits=False.
        """
        if self.pending:
            raise RuntimeError("feed_chains commits: call it with nothing pending")
        counts = np.array([len(c) for c in chains], dtype=np.int64)
        n = int(counts.max(initial=0))
        if n == 0:  # one-token prompts: nothing before the first root
            if logits:
                raise ValueError("nothing to feed: no logits to return")
            return None
        tokens = np.zeros((len(chains), n), dtype=np.int64)
        for r, c in enumerate(chains):
            tokens[r, : len(c)] = c
        valid = np.arange(n)[None, :] < counts[:, None]  # (B, n)
        causal = np.tril(np.ones((n, n), dtype=bool))
        attend = (causal[None] & valid[:, None, :]) | np.eye(n, dtype=bool)[None]  # padding sees only itself
        out = self.forward(tokens, np.arange(n), attend, logits=logits)
        self.commit([np.arange(c) for c in counts])
        if out is None:
            return None
        return out[torch.arange(len(chains), device=out.device), torch.as_tensor(counts - 1, device=out.device)]

    @torch.inference_mode()
    def commit(self, keep: Sequence[np.ndarray]) -> None:
        """Row r keeps the uncommitted entries `keep[r]` (indices into this step's writes), in order."""
        keep = [np.asarray(k, dtype=np.int64) for k in keep]
        if len(keep) != self.rows:
            raise ValueError(f"keep lists for {len(keep)} rows, the cache holds {self.rows}")
        counts = np.array([len(k) for k in keep], dtype=np.int64)
        if any(k.size and (k.min() < 0 or k.max() >= self.pending) for k in keep):
            raise ValueError(f"kept entries must lie in the {self.pending} uncommitted ones")
        moved = [r for r, k in enumerate(keep) if not np.array_equal(k, np.arange(len(k)))]
        if moved:
            m = int(counts[moved].max())
            src = np.empty((len(moved), m), dtype=np.int64)
            dst = np.empty((len(moved), m), dtype=np.int64)
            for i, r in enumerate(moved):
                k = keep[r]  # non-empty: an empty keep list is the identity
                pad = np.full(m - len(k), k[-1])  # repeats of the last move write the same value again
                src[i] = self.lengths[r] + np.concatenate([k, pad])
                dst[i] = self.lengths[r] + np.concatenate([np.arange(len(k)), np.full(m - len(k), len(k) - 1)])
            rows = torch.as_tensor(moved, device=self.device)[:, None]  # (R, 1)
            s, d = torch.as_tensor(src, device=self.device), torch.as_tensor(dst, device=self.device)
            for buf in (*self._keys, *self._values):  # (B, H, C, d): gather first, then write
                picked = buf[rows, :, s].clone()  # (R, m, H, d)
                buf[rows, :, d] = picked
        self.lengths = self.lengths + counts
        self.pending = 0

    # -- internals --------------------------------------------------------------------------
    def _mask(self, attend: np.ndarray, visible: np.ndarray | None = None) -> torch.Tensor:
        """(B, 1, n, used) bool: committed slots (the first `visible` of them), plus the uncommitted ones
        `attend` allows."""
        B, n, u = attend.shape
        dev = self.device
        lengths = torch.as_tensor(self.lengths, device=dev)
        slots = torch.arange(self._used, device=dev)
        if visible is None:
            mask = (slots[None, :] < lengths[:, None])[:, None, :].expand(B, n, self._used).clone()  # (B, n, used)
        else:
            limit = torch.minimum(torch.as_tensor(np.broadcast_to(visible, (B, n)).copy(), device=dev),
                                  lengths[:, None])  # (B, n)
            mask = slots[None, None, :] < limit[:, :, None]
        index = (lengths[:, None, None] + torch.arange(u, device=dev)[None, None, :]).expand(B, n, u)
        mask.scatter_(2, index, torch.as_tensor(np.array(attend), device=dev))
        return mask[:, None]

    def _update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer: int):
        """Write this forward's keys/values (B, H, n, d) into their slots; return slots [0, used)."""
        if self._write is None:
            raise ModelError("the model ran a cached forward outside SlotKV.forward")
        if layer == len(self._keys):  # first forward: allocate this layer (keys and values may differ in shape:
            #                           DeepSeek's latent attention caches a 512-wide latent and a 64-wide key)
            for buffers, new in ((self._keys, key_states), (self._values, value_states)):
                B, H, _, d = new.shape
                buffers.append(new.new_zeros((B, H, self._capacity, d)))
        written = []
        for buf, new in ((self._keys[layer], key_states), (self._values[layer], value_states)):
            index = self._write[:, None, :, None].expand(-1, buf.shape[1], -1, buf.shape[3])  # (B, H, n, d)
            buf.scatter_(2, index, new.to(buf.dtype))
            written.append(buf[:, :, : self._used])
        return tuple(written)

    def _grow(self, needed: int, *, exact: bool = False) -> None:
        """Room for `needed` slots per row: at least doubled (amortised appends), or exactly `needed` (`append`)."""
        if needed <= self._capacity:
            return
        capacity = needed if exact else max(needed, 2 * self._capacity, 64)
        for buffers in (self._keys, self._values):
            for i, buf in enumerate(buffers):
                bigger = buf.new_zeros((*buf.shape[:2], capacity, buf.shape[3]))
                bigger[:, :, : buf.shape[2]] = buf
                buffers[i] = bigger
        self._capacity = capacity

"""Tree-masked forward passes over a KV cache, and keeping only the accepted path.

SpecInfer (Miao et al. 2024) verifies a whole draft tree in ONE target forward: the
tree's tokens go in as a flat sequence, a 4-D attention mask lets each token see the
cached context plus its own ancestors only, and explicit position ids put every
token at (context length + depth). After verification the KV entries of the
accepted path are moved to the slots right after the context and everything behind
them is cut off (gpt-fast keeps a preallocated cache and overwrites rejected slots;
with transformers' growing `DynamicCache` the same idea is a gather + crop).

`KVModel` wraps one causal LM and its cache; the engine and the draft proposers
drive it with three operations: `forward` (a chain or a tree of new tokens over the
cache), `keep` (retain a subset of the newest entries, in order) and `length`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specsim.errors import ModelError


def tree_attend(parents: np.ndarray) -> np.ndarray:
    """(n, n) bool: token i may attend to token j among n tree tokens (j is i or an ancestor).

    `parents[i]` is the index of i's parent among the same n tokens, or -1 when the
    parent is already in the cache (a root or a chain start).
    """
    n = len(parents)
    allowed = np.eye(n, dtype=bool)  # (n, n)
    for i in range(n):
        j = int(parents[i])
        if j >= 0:
            if j >= i:
                raise ValueError(f"token {i} has parent {j}; parents must come first")
            allowed[i] |= allowed[j]
    return allowed


def chain_parents(n: int) -> np.ndarray:
    """Parent indices of n tokens in a causal chain."""
    return np.arange(-1, n - 1, dtype=np.int64)


@dataclass
class KVModel:
    """A causal LM with its own KV cache, fed chains and trees of tokens.

    The cache holds one entry per token fed and kept; `length` is the position the next
    chain token gets. Tree tokens get position `length + depth - 1` for depth-1 tokens
    below a cached parent, and so on.
    """

    model: object  # transformers causal LM in eval mode
    cache: object = None  # transformers DynamicCache; created by `reset`

    def __post_init__(self) -> None:
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        if not self.dtype.is_floating_point:  # quantised modules keep float activations
            self.dtype = torch.float32
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self._prefix = np.empty(0, dtype=np.int64)

    def start(self, tokens: np.ndarray) -> None:
        """Make the cache hold exactly `tokens` (a causal chain from position 0).

        The entries of the longest common prefix with the previous `start` are reused (cut
        back, not recomputed), so decoding the same prompt again skips the prompt pass.
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        n = min(len(tokens), len(self._prefix), self.length)
        same = int(np.argmin(np.append(tokens[:n] == self._prefix[:n], False)))
        if same == 0:
            self.reset()
        elif self.length > same:
            self.cache.crop(-(self.length - same))
        if len(tokens) > same:
            self.feed_chain(tokens[same:])
        self._prefix = tokens

    @property
    def length(self) -> int:
        return int(self.cache.get_seq_length())

    @torch.inference_mode()
    def forward(self, tokens: np.ndarray, positions: np.ndarray, attend: np.ndarray) -> torch.Tensor:
        """Feed n new tokens; return their next-token logits (n, V) float32. All n are appended to the cache.

        `positions` (n,) are their position ids; `attend` (n, length + n) bool says which
        cached and new entries each may see (built from `tree_attend`).
        """
        tokens = np.asarray(tokens, dtype=np.int64)
        n, context = len(tokens), self.length
        if attend.shape != (n, context + n):
            raise ValueError(f"attend has shape {attend.shape}, expected {(n, context + n)}")
        ids = torch.as_tensor(tokens, device=self.device)[None]  # (1, n)
        pos = torch.as_tensor(np.asarray(positions, dtype=np.int64), device=self.device)[None]  # (1, n)
        if attend[:, :context].all() and np.array_equal(attend[:, context:], np.tril(np.ones((n, n), bool))):
            # A causal chain needs no custom mask: the model's own causal mask is the same thing.
            out = self.model(input_ids=ids, position_ids=pos, past_key_values=self.cache, use_cache=True)
        else:
            mask = torch.zeros(attend.shape, dtype=self.dtype)  # (n, context + n) additive
            mask = mask.masked_fill(torch.as_tensor(~attend), torch.finfo(self.dtype).min)
            out = self.model(input_ids=ids, attention_mask=mask[None, None].to(self.device),
                             position_ids=pos, past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.logits[0].float()  # (n, V)

    def feed_chain(self, tokens: np.ndarray) -> torch.Tensor:
        """Append a causal chain right after the cache; logits (n, V)."""
        n, context = len(tokens), self.length
        attend = np.concatenate([np.ones((n, context), bool), tree_attend(chain_parents(n))], axis=1)
        return self.forward(tokens, context + np.arange(n), attend)

    def keep(self, start: int, rows: np.ndarray) -> None:
        """Keep cache entries [0, start) and then entries `start + rows` (in that order); drop the rest.

        After a verification, `rows` are the accepted path's slots among the tokens fed
        since `start`; they move to `start, start + 1, ...` and the cache is cut behind them.
        """
        rows = np.asarray(rows, dtype=np.int64)
        self._prefix = self._prefix[:start]
        total = self.length
        if rows.size and (rows.min() < 0 or start + rows.max() >= total):
            raise ValueError(f"rows {rows.tolist()} after {start} are outside a cache of {total}")
        if np.array_equal(rows, np.arange(rows.size)):
            if total > start + rows.size:  # the accepted entries are already in place
                self.cache.crop(-(total - start - rows.size))
            return
        index = torch.as_tensor(np.concatenate([np.arange(start), start + rows]), device=self.device)
        for layer in self.cache.layers:
            if getattr(layer, "is_sliding", False):
                raise ModelError("live decoding needs a full KV cache; sliding-window layers are not supported")
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)

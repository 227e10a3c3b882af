"""specsim: what speculative decoding will buy you, before you spend GPU weeks.

Record once (``specsim cache``), then replay any draft tree, budget, draft and
sampling policy exactly on a CPU (``specsim simulate``). See DESIGN notes in
``docs/`` and the README.

Importing ``specsim`` is cheap: numpy-side modules load on first use and torch
is imported only by the recording, live and attention commands.
"""

__version__ = "0.1.0"


def simulate(
    cache,
    trees=(),
    drafts=None,
    policies=("greedy",),
    budgets=None,
    temperatures=None,
    multi_draft="iid",
    cost_profile=None,
    cost=None,
    batches=None,
    batching="lockstep",
    by_category=True,
    n_boot=1000,
    samples=64,
    seed=0,
    progress=False,
    unpriced="skip",
    block_positions=None,
    fit_positions=None,
    workers=1,
):
    """Replay speculative decoding configurations on a cache; a polars DataFrame, one row per
    configuration (x batch size) and prompt category ("all" first).

    cache: a file written by `specsim cache`. trees: specs ("chain:4", "kary:2,3", "kary:2@8",
    "optimal:16", "file:tree.json") or families expanded over `budgets` ("chain", "kary:2",
    "optimal"); `specsim trees` lists them. drafts: recorded draft columns (default: all) or
    model-free drafts ("ngram:3", "prompt-lookup:2"). policies: "greedy" (T=0 trajectories),
    "sample" (T>0; trees draw candidates by `multi_draft` "iid" or "swor"), lossy ("p>=q",
    "p>=lq:0.5", "typical") and adaptive ("adaptive-hf", "adaptive-history") rules.
    temperatures: recorded temperatures to use (default: each policy's usable ones).
    cost_profile: a `specsim profile` JSON measured for the cache's models -> `speedup` and
    `tokens_per_s` columns; cost: an assumed "c=RATIO" -> `speedup_assumed`; neither -> no
    speedup. batches (with a profile): extra rows at these batch sizes, `batching` "lockstep"
    or "continuous". unpriced: a tree beyond what the profile measured is dropped ("skip")
    or kept with empty speed columns and the reason in `cost_basis` ("keep"). n_boot, seed: the 95% bootstrap over prompts; samples: Monte-Carlo
    samples per position where an estimator needs them. block_positions: positions replayed at
    once (memory; default 131,072); fit_positions: positions of random trajectories that trees
    fitted on the cache (optimal:N) are fitted on at most (default 262,144); workers: processes
    replaying those blocks at once (the rows do not depend on it; a script using it needs the
    ``if __name__ == "__main__":`` guard that spawned processes need).

    Example:
        >>> import specsim
        >>> rows = specsim.simulate("cache/demo.h5", trees=["chain:4", "optimal:8"], drafts=["int8"],
        ...                         cost_profile="cache/demo-profile.json", batches=[1, 4])
    """
    from specsim.sim.api import simulate as _simulate

    return _simulate(cache, trees, drafts=drafts, policies=policies, budgets=budgets, temperatures=temperatures,
                     multi_draft=multi_draft, cost_profile=cost_profile, cost=cost, batches=batches,
                     batching=batching, by_category=by_category, n_boot=n_boot, samples=samples, seed=seed,
                     progress=progress, unpriced=unpriced, block_positions=block_positions,
                     fit_positions=fit_positions, workers=workers)


__all__ = ["simulate", "__version__"]

"""specsim: what speculative decoding will buy you, before you spend GPU weeks.

Record once (``specsim cache``), then replay any draft tree, budget, draft and
sampling policy exactly on a CPU (``specsim simulate``). See DESIGN notes in
``docs/`` and the README.

Importing ``specsim`` is cheap: numpy-side modules load on first use and torch
is imported only by the recording, live and attention commands.
"""

__version__ = "0.1.0"


def simulate(cache, trees=(), *, progress=False, on_skip=None, **options):
    """Replay speculative decoding configurations on a cache; a polars DataFrame, one row per
    configuration (x batch size) and prompt category ("all" first).

    cache: a file written by `specsim cache`. trees and `options`: the fields of `specsim.SweepConfig`
    (drafts, policies, budgets, temperatures, multi_draft, cost_profile or cost, batches, batching,
    by_category, n_boot, samples, seed, top_k, unpriced, block_positions, fit_positions, workers),
    each documented there. on_skip receives the line of each configuration that cannot run (default:
    printed to stderr); progress shows a bar.

    Example:
        >>> import specsim
        >>> rows = specsim.simulate("cache/demo.h5", trees=["chain:4", "optimal:8"], drafts=["int8"],
        ...                         cost_profile="cache/demo-profile.json", batches=[1, 4])
    """
    from specsim.sim.sweep import simulate as _simulate

    return _simulate(cache, trees, progress=progress, on_skip=on_skip, **options)


def __getattr__(name):
    if name == "SweepConfig":  # loaded on first use: importing specsim stays cheap
        from specsim.sim.sweep import SweepConfig

        return SweepConfig
    raise AttributeError(f"module 'specsim' has no attribute {name!r}")


__all__ = ["simulate", "SweepConfig", "__version__"]

"""specsim: what speculative decoding will buy you, before you spend GPU weeks.

Record once (``specsim cache``), then replay any draft tree, budget, draft and
sampling policy exactly on a CPU (``specsim simulate``). See DESIGN notes in
``docs/`` and the README.

Importing ``specsim`` is cheap: numpy-side modules load on first use and torch
is imported only by the recording, live and attention commands.
"""

__version__ = "0.1.0"


def simulate(cache, **kwargs):
    """Replay configurations against a cache; returns a polars DataFrame.

    See :func:`specsim.sim.api.simulate` for the arguments.
    """
    from specsim.sim.api import simulate as _simulate

    return _simulate(cache, **kwargs)


__all__ = ["simulate", "__version__"]

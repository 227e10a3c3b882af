"""The cache's former single module, kept so that scripts importing it still run: `CacheReader`,
`CacheWriter`, `CacheSpec` and `PromptRecord` now live in `specsim.cache.reader`, `.writer` and
`.layout` (docs/cache-format.md). Importing this module warns once."""

import warnings

from specsim.cache.layout import TARGET, CacheSpec, PromptRecord
from specsim.cache.reader import CacheReader
from specsim.cache.writer import CacheWriter

warnings.warn("specsim.cache.store is split: import CacheReader from specsim.cache.reader, CacheWriter from "
              "specsim.cache.writer, CacheSpec and PromptRecord from specsim.cache.layout", DeprecationWarning,
              stacklevel=2)

__all__ = ["TARGET", "CacheReader", "CacheSpec", "CacheWriter", "PromptRecord"]

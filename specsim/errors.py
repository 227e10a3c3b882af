"""The one error family of the library.

Library code raises these with messages that say what was wrong, where (file,
line, field) and what to do; only the CLI turns them into `click.ClickException`
(one line on stderr, non-zero exit, no traceback).
"""


class SpecsimError(Exception):
    """Base class: anything a user can fix by changing their input."""


class SpecError(SpecsimError):
    """A malformed tree, draft, policy or cost spec string."""


class ModelError(SpecsimError):
    """A model that cannot be resolved, fetched, verified or loaded."""


class TokenizerMismatchError(ModelError):
    """A draft whose tokenizer differs from the target's."""


class PromptError(SpecsimError):
    """An empty, unreadable or malformed prompt file."""


class CacheError(SpecsimError):
    """A cache file that is missing, corrupt, truncated or inconsistent with a request."""


class ResumeMismatchError(CacheError):
    """`--resume` with settings that differ from those recorded in the file."""


class EngineError(SpecsimError):
    """A serving engine specsim drives (vLLM) that is missing, broken, or cannot run a configuration."""

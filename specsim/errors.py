"""The one error family of the library.

Library code raises these with messages that say what was wrong, where (file,
line, field) and what to do; only the CLI turns them into `click.ClickException`
(one line on stderr, non-zero exit, no traceback).
"""


class SpecsimError(Exception):
    """Base class: anything a user can fix by changing their input.

    `naming` builds one whose message mentions the library's arguments: the template names them as
    format fields (`"{n_boot} {value}: use 0 to 5000"`), the other fields are given values. As a
    library error it reads `n_boot 7000: ...`; the command line renders the same error with its
    flags (`--n-boot 7000: ...`, `specsim.cli._common.flag`).
    """

    template: str | None = None  # set by `naming`
    values: dict = {}

    @classmethod
    def naming(cls, template: str, **values: object):
        exc = cls(_render(template, values, lambda name: name))
        exc.template, exc.values = template, values
        return exc

    @property
    def arguments(self) -> tuple[str, ...]:
        """The argument names the message mentions (none unless built by `naming`)."""
        return _arguments(self.template, self.values) if self.template else ()

    def render(self, name_of) -> str:
        """The message with each argument it mentions written as name_of(argument)."""
        return _render(self.template, self.values, name_of) if self.template else str(self)


def _arguments(template: str, values: dict) -> tuple[str, ...]:
    import string

    fields = (name for _, name, _, _ in string.Formatter().parse(template) if name)
    return tuple(dict.fromkeys(n for n in fields if n not in values))


def _render(template: str, values: dict, name_of) -> str:
    return template.format(**values, **{a: name_of(a) for a in _arguments(template, values)})


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



class ArgumentError(SpecError):
    """A bad value of a library argument: `ArgumentError(template, **values)` is `SpecError.naming`."""

    def __init__(self, template: str, **values: object) -> None:
        super().__init__(_render(template, values, lambda name: name))
        self.template, self.values = template, values

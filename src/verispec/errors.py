"""Exception types. Every mistake a user can make maps to one of these, never to a bare traceback."""


class VerispecError(Exception):
    """Base class of every error verispec raises on purpose."""


class InvalidParameterError(VerispecError, ValueError):
    """A generation or engine parameter is out of range (k < 1, temperature < 0, ...)."""


class ModelLoadError(VerispecError):
    """A model path is missing, unreadable, or not a model verispec can load."""


class BundledModelError(ModelLoadError):
    """The bundled model packages are missing, truncated or corrupted."""


class TokenizerMismatchError(VerispecError):
    """Draft and target use different tokenizers, so draft tokens mean nothing to the target."""


class PromptTooLongError(InvalidParameterError):
    """The prompt (plus room for one new token) does not fit the model's context."""

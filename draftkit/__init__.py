"""draftkit: the whole life of a speculative-decoding draft model for an RL policy.

The Python API is `draftkit.api` (one function per CLI verb); the subpackages follow the
lifecycle: core, target, prepare, harvest, train, drafts, export, eval, serving, rl.
"""

__version__ = "0.1.0"

"""SMQP's value syntax: the broker's own (:mod:`broker.domain.values`), which the codec
reads and writes."""

from broker.domain.values import *  # noqa: F403
from broker.domain.values import MAX_INT32, __all__  # noqa: F401

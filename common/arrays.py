"""The array type of kdvfs's numerical code: ``Array`` is ``numpy.ndarray`` (the unit of each array is in its
name, as everywhere)."""

from __future__ import annotations

import numpy as np

Array = np.ndarray

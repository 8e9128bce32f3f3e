"""The offline tools, apart from the training path: ``coverage`` (``naiad check``: every row once,
proved without reading a row) and its report, ``inspection`` (``naiad inspect``), and ``convert``
(``naiad convert``: shards written, optionally shuffled)."""

"""What every layer above shares, importing nothing of the project: the model registry (``models``, with its
``pinned_wheels`` and ``converted_cache``), where data come from (``datasource``), the node's disk caches
(``disk_cache``), the config builder (``config``) and the code's provenance (``provenance``).

Layers, each importing only those before it: common <- kernels <- calibration <- trainable <- sweeps <- benchmarks.
"""

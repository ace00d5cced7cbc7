"""The asv benchmark suite (``benchmarks/asv.conf.json``): ``time_``, ``peakmem_`` and ``track_`` methods."""

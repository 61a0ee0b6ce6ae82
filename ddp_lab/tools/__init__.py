"""The ``ddp-lab`` command and what it runs: doctor, demos by name, benchmarks (``bench_*``)
and the headless notebook runner. Tools may import any chapter; nothing imports tools."""

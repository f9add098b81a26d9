"""hwdist benchmarks: ``python -m benchmarks.run`` runs every ``bench_*.py`` here."""

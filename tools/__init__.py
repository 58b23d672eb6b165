"""Scripts that are not the product: the samples, the real-server scenario matrix and its checks. Outside the
wheel; tests, benchmarks and `make` use them from a checkout."""

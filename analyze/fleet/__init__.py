"""Many logs at once: a Parquet dataset with SQL over it, and a Dask cluster reading them."""

"""Arrow and Parquet tables read in place (datasets' save_to_disk folders, Parquet files)."""

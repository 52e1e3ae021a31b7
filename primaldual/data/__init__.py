"""Datasets: readers, generators and fetchers (UEA time series, Long-Range Arena tasks, images, text)."""

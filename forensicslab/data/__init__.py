"Data: photographs shipped in packages, the offline benchmarks, their generators and the loaders of public datasets."

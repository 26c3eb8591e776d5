"""What both services share and neither owns: options, Kafka end offsets, the metrics server,
the Spanner client, logs, the progress line and the start-up heap kept out of the garbage
collector's walks. Imports neither service."""

"""What both services share and neither owns: options, Kafka end offsets, the metrics server,
the Spanner client, logs and the progress line. Imports neither service."""

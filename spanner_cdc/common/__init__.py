"""What both services share and neither owns: options, Kafka end offsets, the metrics server,
the Spanner client, logs, the progress line and the garbage collector set for a long run.
Imports neither service."""

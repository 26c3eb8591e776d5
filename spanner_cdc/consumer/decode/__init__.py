"""Kafka rows → decoded events, watermarks and quarantine rows: the one gate every message
passes (``gate``; every event read into Arrow columns by ``events``), the rules an event must
satisfy, the writer schemas learned from the schema topic, and the Arrow shapes the sinks take.

Imports nothing of the consumer but its configuration and errors; knows nothing of the sinks.
"""

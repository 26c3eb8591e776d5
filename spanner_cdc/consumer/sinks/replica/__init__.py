"""The replica sink: current state of every source table, merged from its changes."""

"""The replica's stage rows: built and staged by the tasks that decoded a batch (``rows``),
the stage table's layout (``table``), loaded into a PostgreSQL replica by those tasks
(``loaded``), and the rows of held events kept for a later batch (``held``).
"""

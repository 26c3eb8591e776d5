"""``make bench``: measured figures, each beside a raw baseline measured in the same run."""

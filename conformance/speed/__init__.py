"""The speed clause: parallel start pays off and costs nothing afterwards (timing, so judged
from medians of fresh-process trials)."""

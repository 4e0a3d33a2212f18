"""The start clause: how many workers start at once, and what a start is given."""

"""The exit clause: a program that used the loader ends cleanly."""

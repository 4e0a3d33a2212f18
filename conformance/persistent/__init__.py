"""The persistent clause: persistent workers live as long as the loader."""

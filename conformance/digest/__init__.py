"""The digest clause: the first batches' content, the same for every parallelism and context, and
torch's for the same arguments."""
